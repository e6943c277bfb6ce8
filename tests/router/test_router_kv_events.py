"""Engine KV events into the prefix index: the wire formats, token-aligned keys, evictions and the subscription."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from xpyd_emulator.kv_events import KvEventsConfig
from xpyd_emulator.kv_publisher import ZmqPublisher
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.tokens import block_hashes_text, token_ids
from xpyd_router.kv.block_keys import RequestKeys, prompt_ids, token_block_keys
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import Cleared, Removed, Stored, WireError, decode_batch
from xpyd_router.kv_events import KvEventHub, Subscription
from xpyd_router.tokens.engine import EmulatorTokenizer

HOST = "127.0.0.1"
KEYS = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
TEXT = "You are a helpful assistant. Answer briefly. " * 12  # 540 chars: 135 tokens, 8 full blocks
IDS = list(range(32))
TURN2 = TEXT + "<|im_start|>user\n" + "and a follow-up question " * 12 + "<|im_end|>\n"  # 13 full blocks


def _pack(*events: Any, outer: str = "array") -> bytes:
    batch: Any = [1.5, list(events), 0] if outer == "array" else {"ts": 1.5, "events": list(events)}
    return msgspec.msgpack.encode(batch)


def _stored_map(**fields: Any) -> dict[str, Any]:
    base = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": IDS,
            "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    ("payload", "events"),
    [  # vLLM <= 0.2x (array_like) and SGLang: positional, tagged arrays
        (_pack(["BlockStored", [1, 2], None, IDS, 16, None, "GPU"]), [Stored([1, 2], None, IDS, 16)]),
        (_pack(["BlockStored", [3], 2, IDS[:16], 16, None]), [Stored([3], 2, IDS[:16], 16)]),  # before `medium`
        (_pack(["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]), [Removed([1]), Cleared()]),
        (_pack(["BlockStored", [b"\x00" * 24 + (5).to_bytes(8, "big")], None, IDS[:16], 16, None, "GPU"]),
         [Stored([5], None, IDS[:16], 16)]),  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: bytes, read as llm-d does
        (_pack(["BlockStored", [1], None, IDS[:16], 16, 3, "GPU"]), []),  # a LoRA's block: other tokens' meaning
        (_pack(["BlockStored", [1], None, IDS[:16], 16, None, "CPU_PINNED"]), []),  # an offload tier
        (_pack(["BlockStored", [1], None, IDS[:16], 16, None, "GPU", {"cache_salt": "t"}]),
         [Stored([1], None, IDS[:16], 16, "t")]),  # SGLang, salted: keyed under its salt
        (_pack(["BlockStored", [1], None, IDS[:16], 16, None, "GPU", {}]), [Stored([1], None, IDS[:16], 16)]),
        (_pack(["BlockRemoved", [1], "CPU_PINNED"]), []),
        (_pack(["SomethingNew", 1]), []),
        # vLLM after vllm-project/vllm#42892: each event a map with a "type" key (the batch may be one too)
        (_pack(_stored_map()), [Stored([1, 2], None, IDS, 16)]),
        (_pack(_stored_map(), outer="map"), [Stored([1, 2], None, IDS, 16)]),
        (_pack(_stored_map(group_idx=1)), []),  # a hybrid model's other KV-cache group
        (_pack(_stored_map(extra_keys=[None, ["mm-hash", 0]])), []),
        (_pack(_stored_map(lora_name="adapter")), []),
        (_pack({"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU", "group_idx": 0}), [Removed([9])]),
    ],
)  # fmt: skip
def test_decode_batch_reads_every_engine_encoding(payload: bytes, events: list[Any]) -> None:
    assert decode_batch(payload) == events


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode([1.0]), _pack([1, 2]), _pack(["BlockStored", [1.5], None, [], 16]),
     _pack({"type": "BlockStored"}), msgspec.msgpack.encode("hello")],
)  # fmt: skip
def test_decode_batch_refuses_other_payloads(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)


@pytest.mark.parametrize("text", ["", "abc", "abcd", "héllo wörld, 𝄞 and \ud800 too", TEXT, "x" * 1001])
def test_the_router_tokenizes_exactly_as_the_emulator(text: str) -> None:
    assert np.array_equal(EmulatorTokenizer().encode(text), token_ids(text))


def test_keys_from_a_stored_event_continue_a_prompts_keys() -> None:
    ids = token_ids(TEXT)
    whole = token_block_keys(ids, 16)
    assert token_block_keys(ids[48:], 16, parent=whole[2], depth=3) == whole[3:]
    assert len(whole) == 8 and len(set(whole)) == 8
    assert token_block_keys(ids[16:32], 16) != whole[1:2]  # same tokens, other depth and parent: other key
    assert KEYS(TEXT) == whole
    assert KEYS("ignored", prompt_ids({"prompt": [ids.tolist()]})) == whole
    assert prompt_ids({"prompt": "text"}) is None and prompt_ids({"prompt": [-1, 2]}) is None


def _engine(blocks: int = 64) -> BlockPool:
    pool = BlockPool(blocks, 16)
    pool.events = []
    return pool


def _feed(pool: BlockPool, view: EngineView) -> None:
    """The engine's events of its last step, through vLLM's wire format, into the view."""
    from xpyd_emulator.kv_publisher import KVEventBatch, to_wire

    view.apply(decode_batch(msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(pool.take_events(), 16, False), 0))))


def _serve(pool: BlockPool, text: str) -> None:
    ids = token_ids(text)
    hashes = block_hashes_text(text, 16)
    pool.match(hashes)
    pool.insert(hashes, ids)


def test_the_index_follows_what_the_engine_stores_and_evicts() -> None:
    index = PrefixIndex()
    engine, view = _engine(blocks=12), EngineView("w", index, 16)
    turn1, turn2 = TEXT, TURN2
    _serve(engine, turn1)
    _feed(engine, view)
    assert index.match(KEYS(turn2)) == {"w": 8}  # the first turn's 8 blocks, keyed as the request keys them
    _serve(engine, turn2)  # stores blocks 8-12 after parent 7; 13 > 12: the LRU end (turn 2's last) goes
    _feed(engine, view)
    assert index.match(KEYS(turn2)) == {"w": len(engine)} == {"w": 12}
    assert view.stats.removed == 1
    _serve(engine, "something else entirely, " * 60)  # 23 blocks: evicts all of turn 2
    _feed(engine, view)
    assert index.match(KEYS(turn2)) == {}
    engine.reset()
    _feed(engine, view)
    assert index.blocks_of("w") == 0 and view.stats.cleared == 1


def test_blocks_the_view_cannot_key_are_skipped_and_counted() -> None:
    index = PrefixIndex()
    view = EngineView("w", index, 16)
    view.apply([Stored([7], 99, IDS[:16], 16)])  # parent never seen (lost beyond the replay buffer)
    view.apply([Stored([7], None, IDS[:16], 32), Stored([8], None, IDS[:8], 16)])  # other block size; short
    assert (view.stats.orphans, view.stats.mismatched, index.blocks_of("w")) == (1, 2, 0)
    view.apply([Removed([12345])])  # an unknown block: nothing to do
    assert view.stats.removed == 0


def test_an_event_fed_worker_keeps_the_routers_guesses_until_its_events_settle_them() -> None:
    index = PrefixIndex()
    index.record("w", [1, 2, 3])  # modelled: what the router routed there
    assert index.blocks_of("w") == 3
    view = EngineView("w", index, 16)
    view.apply([])  # its engine publishes: what was modelled before goes
    assert index.blocks_of("w") == 0
    index.record("w", [1, 2, 3])  # routed there, not computed yet: a guess until the events tell
    assert index.match([1, 2, 3]) == {"w": 3}
    index.discard("w", [2, 3])  # the engine evicted them (its BlockRemoved, through the view's keys)
    assert index.match([1, 2, 3]) == {"w": 1}


@pytest.mark.parametrize(("fed", "stored", "held"), [(False, 6, 4), (True, 6, 4), (True, 3, 3)])
def test_capacity_bounds_a_worker_fed_or_modelled(fed: bool, stored: int, held: int) -> None:
    index = PrefixIndex()
    index.set_capacity("w", 4)
    index.set_fed("w", fed)
    index.store("w", list(range(stored)))
    assert index.blocks_of("w") == held
    assert index.match(list(range(stored))) == {"w": held}  # what goes first is a prompt's tail


def _port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


async def _until(check: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def _publisher() -> tuple[ZmqPublisher, str, str]:
    events, replay = _port(), _port()
    config = KvEventsConfig(f"tcp://*:{events}", f"tcp://*:{replay}", topic="kv-events")
    return ZmqPublisher(config, HOST, 16), f"tcp://{HOST}:{events}", f"tcp://{HOST}:{replay}"


async def test_a_subscription_replays_what_came_before_it_then_follows_live() -> None:
    publisher, events, replay = _publisher()
    engine, index = _engine(), PrefixIndex()
    ctx = zmq.asyncio.Context()
    sub = Subscription(ctx, events, replay, "kv-events", EngineView("w", index, 16), lambda: True)
    try:
        _serve(engine, TEXT)
        publisher.publish(engine.take_events())  # seq 0, before anyone listens
        await asyncio.sleep(0.1)
        task = asyncio.create_task(sub.run())
        await _until(lambda: sub.last == 0)  # joined through the replay socket
        assert index.match(KEYS(TURN2)) == {"w": 8}
        await asyncio.sleep(0.3)  # the SUB socket's subscription reaches the publisher
        _serve(engine, TURN2)
        publisher.publish(engine.take_events())  # seq 1, live
        await _until(lambda: sub.last == 1)
        assert index.match(KEYS(TURN2)) == {"w": 13}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        publisher.shutdown()
        ctx.destroy(linger=0)


async def test_a_quiet_stream_asks_the_replay_socket_for_what_its_sub_missed() -> None:
    publisher, _, replay = _publisher()
    engine, index = _engine(), PrefixIndex()
    ctx = zmq.asyncio.Context()
    silent = _port()  # a SUB that never hears anything: every live batch is missed, as while joining
    sub = Subscription(ctx, f"tcp://{HOST}:{silent}", replay, "kv-events", EngineView("w", index, 16),
                       lambda: True, quiet=0.2)  # fmt: skip
    task = asyncio.create_task(sub.run())
    try:
        await asyncio.sleep(0.1)  # joined: the replay buffer was empty
        assert sub.last is None
        _serve(engine, TEXT)
        publisher.publish(engine.take_events())  # seq 0, and nothing after it to show a gap
        await _until(lambda: sub.last == 0)
        assert index.match(KEYS(TURN2)) == {"w": 8}
        _serve(engine, TURN2)
        publisher.publish(engine.take_events())  # seq 1: asked for from last + 1 on
        await _until(lambda: sub.last == 1)
        assert index.match(KEYS(TURN2)) == {"w": 13}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        publisher.shutdown()
        ctx.destroy(linger=0)


async def test_a_gap_in_seq_is_filled_from_the_replay_socket() -> None:
    publisher, _, replay = _publisher()
    engine, index = _engine(), PrefixIndex()
    ctx = zmq.asyncio.Context()
    sub = Subscription(ctx, "", replay, "kv-events", EngineView("w", index, 16), lambda: True)
    try:
        _serve(engine, TEXT)
        publisher.publish(engine.take_events())  # seq 0
        _serve(engine, TURN2)
        publisher.publish(engine.take_events())  # seq 1
        await asyncio.sleep(0.2)
        await sub.on_live(1, b"not read: replayed first")  # joined at seq 1: 0 and 1 come by replay
        assert (sub.last, index.match(KEYS(TURN2))) == (1, {"w": 13})
        publisher.publish([("removed", [block_hashes_text(TURN2, 16)[11]])])  # seq 2: lost on the way
        publisher.publish([])  # seq 3
        await asyncio.sleep(0.2)
        await sub.on_live(3, b"not read either")
        assert (sub.last, index.match(KEYS(TURN2))) == (3, {"w": 11})
        await sub.on_live(3, b"\xc1")  # seq did not grow: a restarted engine; start over from its replay buffer
        assert (sub.view.stats.resets, sub.last, index.match(KEYS(TURN2))) == (1, 3, {"w": 11})
    finally:
        publisher.shutdown()
        ctx.destroy(linger=0)


@pytest.mark.parametrize(
    ("seqs", "applied", "resets"),
    [
        ([0, 1, 2], [0, 1, 2], 0),
        ([0, 1, 1, 2], [0, 1, 1, 2], 1),  # a repeated seq: the engine restarted (seq only grows in one process)
        ([3, 4], [3, 4], 0),  # joined late, nothing to replay from
        ([0, 2, 5], [0, 2, 5], 0),  # gaps with no replay socket: applied as they come
        ([5, 2], [5, 2], 1),
    ],
)
async def test_seq_order_gaps_and_restarts_without_a_replay_socket(seqs: list[int], applied: list[int],
                                                                    resets: int) -> None:  # fmt: skip
    seen: list[int] = []

    class Recording(Subscription):
        def apply(self, seq: int, payload: bytes) -> None:
            seen.append(seq)
            self.last = seq

    view = EngineView("w", PrefixIndex(), 16)
    sub = Recording(zmq.asyncio.Context.instance(), "", "", "", view, lambda: True)  # no replay socket: no I/O
    for seq in seqs:
        await sub.on_live(seq, b"")
    assert (seen, view.stats.resets) == (applied, resets)


async def test_the_hub_follows_the_pool_and_feeds_routing() -> None:
    from xpyd_router.model import RouteRequest
    from xpyd_router.policy.registry import KvAwarePolicy
    from xpyd_router.pool import WorkerPool, WorkerSpec
    from xpyd_router.scrape import WorkerMetrics

    ports = {name: (_port(), _port()) for name in ("a", "b")}
    publishers = {
        n: ZmqPublisher(KvEventsConfig(f"tcp://*:{e}", f"tcp://*:{r}"), HOST, 16) for n, (e, r) in ports.items()
    }
    pool = WorkerPool(KvAwarePolicy(), 256, 4.0, KEYS)
    endpoints = zip((1, 2), ports.values(), strict=True)
    pool.set_workers(
        [WorkerSpec(f"http://{HOST}:{n}", "worker", kv_events=f"tcp://{HOST}:{e}", kv_replay=f"tcp://{HOST}:{r}")
         for n, (e, r) in endpoints]
    )  # fmt: skip
    for name in pool.workers:
        pool.apply_metrics(name, WorkerMetrics(block_size=16, num_gpu_blocks=1000))
    hub = KvEventHub(pool, replay_timeout=0.5)
    job = asyncio.create_task(hub.run(interval=0.05))
    try:
        engine = _engine()
        _serve(engine, TEXT)
        publishers["b"].publish(engine.take_events())
        await _until(lambda: pool.index.blocks_of(f"http://{HOST}:2") == 8)
        plan = pool.route(RouteRequest(KEYS(TEXT + "next"), key=1))
        assert (plan.decode.worker, plan.decode.matched_blocks) == (f"http://{HOST}:2", 8)
        pool.set_workers([])  # both leave: their subscriptions end
        await _until(lambda: not hub.subs)
    finally:
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        for publisher in publishers.values():
            publisher.shutdown()


@pytest.mark.parametrize(("first", "adopted"), [(64, True), (16, False)])
def test_the_router_adopts_the_engines_block_size_before_it_keyed_any_block(first: int, adopted: bool) -> None:
    from xpyd_router.policy.registry import KvAwarePolicy
    from xpyd_router.pool import WorkerPool, WorkerSpec

    keys = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
    pool = WorkerPool(KvAwarePolicy(), 256, 4.0, keys)
    pool.set_workers([WorkerSpec("a", "worker"), WorkerSpec("b", "worker")])
    pool.index.record("a", [1, 2, 3])  # a guess keyed under the old size
    sizes: list[int] = []
    hub = KvEventHub(pool, retune=sizes.append)
    try:
        a = hub.views["a"] = EngineView("a", pool.index, 16, hub.adopt)
        b = hub.views["b"] = EngineView("b", pool.index, 16, hub.adopt)
        ids = [int(t) for t in token_ids(TEXT)]
        a.apply([Stored([1, 2], None, ids[: 2 * first], first)])  # vLLM chose 64-token blocks for this model
        assert keys.block_size == (64 if adopted else 16)
        assert sizes == ([64] if adopted else [])
        assert pool.index.match(keys(TEXT)) == {"a": 2}
        b.apply([Stored([9], None, ids[:32], 32)])  # another size once one was keyed: counted, not adopted
        assert (b.stats.mismatched, keys.block_size, b.block_size) == (1, a.block_size, a.block_size)
    finally:
        hub.ctx.destroy(linger=0)


def test_kv_event_counts_are_exported_per_worker_at_scrape_time() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from xpyd_router.kv.engine_view import ViewStats
    from xpyd_router.metrics import RouterMetrics

    views = {"http://10.0.0.1:8000#dp1": ViewStats(stored=5, removed=2, orphans=1, batches=3)}
    metrics = RouterMetrics("dd", CollectorRegistry())
    metrics.kv_events(lambda: views)
    text = generate_latest(metrics.registry).decode()
    assert 'xpyd_router_kv_event_batches_total{deployment="dd",worker="http://10.0.0.1:8000#dp1"} 3.0' in text
    for outcome, n in (("stored", 5), ("removed", 2), ("orphaned", 1), ("mismatched", 0)):
        line = f'xpyd_router_kv_event_blocks_total{{deployment="dd",outcome="{outcome}",worker="http://10.0.0.1:8000#dp1"}}'
        assert f"{line} {n}.0" in text, text
    views["http://10.0.0.2:8000"] = ViewStats(batches=1)  # read again at the next scrape
    assert 'worker="http://10.0.0.2:8000"} 1.0' in generate_latest(metrics.registry).decode()
