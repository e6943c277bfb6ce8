"""Pure parts of the emulator: tokens and hashes, the block pool, leases, request validation, engine steps."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from xpyd_emulator.bootstrap import RoomTable
from xpyd_emulator.engine import Engine, Sequence
from xpyd_emulator.kvtransfer import LeaseTable
from xpyd_emulator.metrics import EngineMetrics
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.protocol import ApiError, ParsedRequest, parse_request
from xpyd_emulator.tokens import block_hashes_ids, block_hashes_text, count_tokens, filler
from xpyd_perf import GPUS, resolve_model


def test_tokens_and_chained_hashes() -> None:
    assert [count_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]
    a = block_hashes_text("x" * 64 * 3 + "tail", 16)
    b = block_hashes_text("x" * 64 * 2 + "y" * 64, 16)
    assert len(a) == 3
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    c = block_hashes_text("z" * 64 + "x" * 128, 16)
    assert c[1] != a[1]  # same block text, different prefix: chained
    assert len(block_hashes_ids(list(range(40)), 16)) == 2
    assert filler(0, 3) == filler(0, 1) + filler(1, 1) + filler(2, 1)
    assert len(filler(5000, 2)) == 8


def test_block_pool_lru_and_pinning() -> None:
    pool = BlockPool(num_blocks=3, block_size=16)
    pool.insert([1, 2, 3])
    assert pool.match([1, 2, 9]) == 2
    pool.insert([4])  # evicts 3, the least recently used
    assert pool.match([3]) == 0
    assert pool.match([1, 2, 4]) == 3
    assert pool.try_pin(2)
    assert not pool.try_pin(2)
    assert pool.usage == pytest.approx(2 / 3)
    pool.unpin(2)
    assert pool.free == 3
    assert BlockPool(4, 16, enabled=False).match([1]) == 0


def test_leases_release_once_and_expire() -> None:
    pool = BlockPool(100, 16)
    leases = LeaseTable(pool, "engine-a", lease_seconds=30)
    pool.try_pin(5)
    ids = leases.grant(5, 80, now=0.0)
    assert len(ids) == 5
    with pytest.raises(LookupError, match="not this prefill engine"):
        leases.release("engine-b", ids)
    assert leases.release("engine-a", ids).tokens == 80
    assert pool.pinned == 0
    with pytest.raises(LookupError, match="unknown or their lease expired"):
        leases.release("engine-a", ids)
    pool.try_pin(4)
    late = leases.grant(4, 64, now=0.0)
    assert leases.expire(now=29.0) == 0
    assert leases.expire(now=31.0) == 1
    assert pool.pinned == 0
    with pytest.raises(LookupError):
        leases.release("engine-a", late)


def _parse(body: object, chat: bool = False, max_model_len: int = 1000) -> ParsedRequest:
    return parse_request(
        orjson.dumps(body), chat=chat, served=["m"], max_model_len=max_model_len, block_size=16,
        hash_blocks=True, default_output_tokens=256,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "chat", "status", "message"),
    [
        ({"model": "other", "prompt": "x"}, False, 404, "does not exist"),
        ({"prompt": "x", "max_tokens": 0}, False, 400, "at least 1"),
        ({"prompt": "x", "max_tokens": "5"}, False, 400, "integer"),
        ({"prompt": "x", "temperature": -1}, False, 400, "temperature"),
        ({"prompt": "x", "top_p": 0}, False, 400, "top_p"),
        ({"prompt": "x", "n": 2}, False, 400, "n must be 1"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, False, 400, "stream=True"),
        ({"prompt": "x", "stream": "yes"}, False, 400, "stream must be a boolean"),
        ({"prompt": ""}, False, 400, "cannot be empty"),
        ({"prompt": {"a": 1}}, False, 400, "prompt must be"),
        ({}, False, 400, "prompt is required"),
        ({"prompt": "x" * 4000, "max_tokens": 10}, False, 400, "maximum context length is 1000"),
        ({"prompt": "x", "kv_transfer_params": [1]}, False, 400, "kv_transfer_params"),
        ({"messages": []}, True, 400, "messages"),
        ({"messages": [{"content": "hi"}]}, True, 400, "role"),
        ([1, 2], False, 400, "JSON object"),
    ],
)
def test_bad_requests(body: object, chat: bool, status: int, message: str) -> None:
    with pytest.raises(ApiError, match=message) as err:
        _parse(body, chat)
    assert err.value.status == status
    doc = orjson.loads(err.value.body())["error"]
    assert set(doc) == {"message", "type", "param", "code"}
    assert doc["code"] == status
    assert doc["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_good_requests() -> None:
    req = _parse({"prompt": [[1] * 40], "max_tokens": 3})
    assert (req.prompt_tokens, len(req.hashes), req.max_tokens, req.finish_reason) == (40, 2, 3, "length")
    chat = _parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}, chat=True)
    assert (chat.max_tokens, chat.finish_reason, chat.stream) == (256, "stop", False)
    assert _parse({"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}).include_usage
    with pytest.raises(ApiError, match="not valid JSON"):
        parse_request(b"{", chat=False, served=["m"], max_model_len=10, block_size=16, hash_blocks=True,
                      default_output_tokens=1)  # fmt: skip


def test_metrics_render_parses_with_prometheus_client() -> None:
    m = EngineMetrics("m", 16, 1234)
    m.ttft.observe(0.2)
    m.itl.observe(0.01, 3)
    families = {f.name: f for f in text_string_to_metric_families(m.render())}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:cache_config_info"):  # fmt: skip
        assert name in families, name
    info = families["vllm:cache_config_info"].samples[0].labels
    assert (info["block_size"], info["num_gpu_blocks"], info["model_name"]) == ("16", "1234", "m")
    itl_count = [s for s in families["vllm:inter_token_latency_seconds"].samples if s.name.endswith("_count")]
    assert itl_count[0].value == 3


async def test_engine_admits_under_budget_and_queues_the_rest() -> None:
    model = resolve_model("llama-3.1-8b")
    pool = BlockPool(10_000, 16)
    metrics = EngineMetrics("m", 16, 10_000)
    engine = Engine(model, GPUS["B200"], 1, pool, metrics, max_num_batched_tokens=1000, max_num_seqs=8)
    seqs = [Sequence(600, [], 4, 0.0) for _ in range(3)]
    for seq in seqs:
        engine.submit(seq)
    decodes, chunks, seconds = engine.schedule(0.0)
    assert [n for _, n in chunks] == [600, 400]  # the second gets a partial chunk; the third waits
    assert not decodes
    assert seconds > 0
    engine.apply(decodes, chunks, 0.1)
    assert (metrics.running, metrics.waiting) == (2, 1)
    assert seqs[0].generated == 1
    assert seqs[0].event.is_set()
    run = asyncio.create_task(engine.run())
    await asyncio.wait_for(asyncio.gather(*(_until_done(s) for s in seqs)), 10)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert all(s.generated == 4 for s in seqs)
    assert pool.pinned == 0
    assert metrics.generation_tokens == 12


async def test_engine_caches_blocks_when_it_schedules_them_as_vllm_does() -> None:
    """vLLM registers a step's full blocks in its prefix cache when it schedules them (allocate_slots
    -> cache_blocks), so a prompt scheduled after another one sharing its prefix hits the blocks
    before they are computed, in the same step as in a later one (vllm-project/vllm#29387)."""
    model = resolve_model("llama-3.1-8b")
    pool = BlockPool(10_000, 16)
    metrics = EngineMetrics("m", 16, 10_000)
    engine = Engine(model, GPUS["B200"], 1, pool, metrics, max_num_batched_tokens=1000, max_num_seqs=8)
    doc = list(range(50))  # 800 tokens
    first, same_step = Sequence(800, doc, 4, 0.0), Sequence(800, doc, 4, 0.0)
    engine.submit(first)
    engine.submit(same_step)
    _, chunks, _ = engine.schedule(0.0)
    assert [(seq.cached, n) for seq, n in chunks] == [(0, 800), (799, 1)]  # all but the token it must compute
    engine.apply([], chunks, 0.1)
    long = list(range(1000, 1100))  # 1,600 tokens: two steps of prefill
    chunked = Sequence(1600, long, 4, 0.1)
    engine.submit(chunked)
    _, chunks, _ = engine.schedule(0.1)
    engine.apply([], chunks, 0.2)
    assert chunked.computed < chunked.prompt  # its prefill has a step to go...
    later = Sequence(1600, [*long[:62], 99_999], 4, 0.2)
    engine.submit(later)
    engine.schedule(0.2)
    assert later.cached == 62 * 16  # ...yet the blocks its first step covered are hits already


async def _until_done(seq: Sequence) -> None:
    while not seq.done:
        await seq.event.wait()
        seq.event.clear()


async def test_bootstrap_rooms_hand_over_once_and_expire() -> None:
    rooms = RoomTable(lease_seconds=5)
    waiter = asyncio.create_task(rooms.claim(7, wait_seconds=5))
    await asyncio.sleep(0)
    rooms.publish(7, {"tokens": 100}, now=0.0)
    assert await waiter == {"tokens": 100}
    assert len(rooms) == 0
    assert await rooms.claim(8, wait_seconds=0.01) is None
    assert len(rooms) == 0
    rooms.publish(9, {"tokens": 1}, now=0.0)
    assert rooms.expire(now=4.0) == 0
    assert rooms.expire(now=6.0) == 1


def test_block_pool_evicts_in_batches_from_the_cold_end() -> None:
    pool = BlockPool(num_blocks=128, block_size=16)
    pool.insert(list(range(128)))  # one prompt: its tail is the coldest, as vLLM frees blocks in reverse
    assert pool.match([0]) == 1
    pool.insert([1000])
    assert len(pool) == 127  # a batch of 128 // 64 = 2 went: the prompt's last blocks, 127 and 126
    assert pool.match(list(range(128))) == 126  # the cached prefix got shorter, not headless
    assert pool.match([1000]) == 1
    assert pool.evictions == 2
