"""Router replicas agree without talking: fed the same engine events and metrics, each makes the same choice."""

from __future__ import annotations

import random

import msgspec
import pytest

from xpyd_emulator.kv_publisher import KVEventBatch, to_wire
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.tokens import block_hashes_text, token_ids
from xpyd_router.hashing import affinity_key
from xpyd_router.kv.block_keys import RequestKeys
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.wire import decode_batch
from xpyd_router.model import RouteRequest
from xpyd_router.policy.registry import make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec
from xpyd_router.scrape import WorkerMetrics
from xpyd_router.tokens.engine import EmulatorTokenizer

KEYS = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
NAMES = [f"http://127.0.0.1:{8100 + i}" for i in range(4)]
SYSTEM = "<|im_start|>system\nYou are a careful assistant for a retail company; be brief.<|im_end|>\n" * 3


def _replica(policy: str, order: list[str]) -> tuple[WorkerPool, dict[str, EngineView]]:
    pool = WorkerPool(make_policy(policy), 256, 4.0, KEYS)
    pool.set_workers([WorkerSpec(name, "worker") for name in order])
    return pool, {name: EngineView(name, pool.index, 16) for name in order}


def _conversations(seed: int, turns: int) -> list[str]:
    """Prompts of interleaved multi-turn chats sharing a system prompt (each turn extends its history)."""
    rng = random.Random(seed)
    history = [SYSTEM for _ in range(6)]
    prompts = []
    for _ in range(turns):
        c = rng.randrange(len(history))
        history[c] += f"<|im_start|>user\n{'question ' * rng.randrange(5, 40)}#{rng.random()}<|im_end|>\n"
        prompts.append(history[c])
        history[c] += f"<|im_start|>assistant\n{'answer ' * rng.randrange(5, 30)}<|im_end|>\n"
    return prompts


@pytest.mark.parametrize("policy", ["kv-aware", "least-loaded"])
def test_replicas_fed_the_same_events_and_metrics_choose_the_same_worker(policy: str) -> None:
    a, views_a = _replica(policy, NAMES)
    b, views_b = _replica(policy, NAMES[::-1])  # discovered in another order
    engines = {name: BlockPool(96, 16) for name in NAMES}  # small caches: evictions happen
    for engine in engines.values():
        engine.events = []
    rng = random.Random(7)
    for step, text in enumerate(_conversations(seed=3, turns=120)):
        if step % 5 == 0:  # a scrape: both replicas read the same /metrics
            for name in NAMES:
                metrics = WorkerMetrics(rng.randrange(3), rng.randrange(6), rng.random(), 16, 96)
                a.apply_metrics(name, metrics)
                b.apply_metrics(name, metrics)
        blocks = KEYS(text)
        req = RouteRequest(blocks, affinity_key(blocks, text), len(text))
        # Each request reaches one replica only; the other routes it too, to show it would have chosen the same.
        mine, other = (a, b) if step % 2 else (b, a)
        chosen = mine.route(req)
        assert other.route(req) == chosen, f"replicas disagree at request {step}"
        engine = engines[chosen.decode.worker]  # the engine serves it and reports what it cached and evicted
        hashes = block_hashes_text(text, 16)
        engine.match(hashes)
        engine.insert(hashes, token_ids(text))
        payload = msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(engine.take_events(), 16, False), 0))
        for views in (views_a, views_b):
            views[chosen.decode.worker].apply(decode_batch(payload))
    assert {n: a.index.blocks_of(n) for n in NAMES} == {n: b.index.blocks_of(n) for n in NAMES}
    # Every engine's cache is full; the index, bounded by the same capacity, holds as many blocks less
    # what it evicted in its own LRU order (the engines' hits reorder theirs unseen): a few percent.
    held, indexed = sum(len(e) for e in engines.values()), sum(a.index.blocks_of(n) for n in NAMES)
    assert 0.9 * held <= indexed <= held


def test_a_worker_without_events_is_modelled_with_its_reported_capacity() -> None:
    pool, _ = _replica("kv-aware", NAMES[:1])
    pool.apply_metrics(NAMES[0], WorkerMetrics(block_size=16, num_gpu_blocks=10))
    assert pool.workers[NAMES[0]].capacity_blocks == 10  # engine blocks, one key each
    first, second = KEYS(SYSTEM * 2)[:8], KEYS("another prompt entirely, " * 30)[:6]
    pool.index.record(NAMES[0], first)
    pool.index.record(NAMES[0], second)  # 14 > 10: the first prompt loses its tail, as vLLM would evict it
    assert pool.index.match(first) == {NAMES[0]: 4}
    assert pool.index.match(second) == {NAMES[0]: 6}
