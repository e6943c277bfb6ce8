"""Unit tests of the simulator's parts: prefix cache, trace loaders, histogram and one worker."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from xpyd_api.metric_names import token_buckets
from xpyd_sim import trace
from xpyd_sim.cache import PrefixCache
from xpyd_sim.metrics import Histogram, bucket_quantile
from xpyd_sim.request import SimRequest
from xpyd_sim.worker import Worker


class FakePerf:
    """Linear timings that are easy to compute by hand."""

    kv_bytes_per_token = 1000
    host_bandwidth = 64e9

    def __init__(self, capacity: int = 100_000, per_token: float = 1e-4, step: float = 0.01) -> None:
        self.kv_capacity_tokens = capacity
        self.per_token = per_token
        self.step = step

    def step_seconds(self, chunks: Sequence[tuple[int, int]], batch: int, ctx_total: int) -> float:
        return self.step + self.per_token * sum(new for new, _ in chunks)

    def decode_step_seconds(self, batch: int, ctx_total: int) -> float:
        return self.step


@pytest.mark.parametrize(
    ("capacity", "inserts", "query", "hits"),
    [
        (10, [[1, 2, 3]], [1, 2, 3, 4], 3),
        (10, [[1, 2, 3]], [9, 2, 3], 0),  # only a leading run counts
        (2, [[1, 2, 3]], [1, 2, 3], 2),  # the tail was evicted first
        (3, [[1, 2], [1, 5]], [1, 2], 2),
        (2, [[1, 2], [3]], [1, 2], 1),  # 2, the old tail, is the coldest
        (0, [[1]], [1], 0),
    ],
)
def test_prefix_cache_lru(capacity: int, inserts: list[list[int]], query: list[int], hits: int) -> None:
    cache = PrefixCache(capacity)
    for blocks in inserts:
        cache.insert(blocks)
    assert cache.match(query) == hits
    assert len(cache) <= capacity


def test_prefix_cache_trim_and_bad_capacity() -> None:
    cache = PrefixCache(5)
    cache.insert([1, 2, 3, 4])
    cache.trim(1)
    assert len(cache) == 1
    assert 1 in cache
    assert cache.evictions == 3
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(-1)


def test_mooncake_buckets_are_spread_evenly(mooncake_file: Path) -> None:
    reqs = list(trace.load(mooncake_file))
    assert len(reqs) == 120
    first = [r.arrival for r in reqs[:10]]
    assert first == pytest.approx([0.3 * i for i in range(10)])
    assert all(x.arrival <= y.arrival for x, y in itertools.pairwise(reqs))
    assert reqs[1].blocks[:3] == (0, 1, 2)


def test_azure_csv(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,1100,44\n2023-11-16 18:15:48.1805900,20,5\n"
    )
    reqs = list(trace.load(path))
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 1.5])
    assert (reqs[0].prompt_tokens, reqs[0].output_tokens, len(reqs[0].blocks)) == (1100, 44, 2)
    assert not set(reqs[0].blocks) & set(reqs[1].blocks)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"timestamp": 1}\n', "not a Mooncake record"),
        ("bad.csv", "a,b\n1,2\n", "missing columns"),
        ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "bad Azure row"),
        ("bad.txt", "x", "unknown trace format"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(trace.TraceError, match=message):
        list(trace.load(path))
    with pytest.raises(trace.TraceError, match="does not exist"):
        trace.load(tmp_path / "missing.jsonl")


def test_synthetic_is_deterministic_and_scaled_keeps_order() -> None:
    cfg = trace.Synthetic(rate=20, duration=10, shared_prefixes=2, seed=7)
    a, b = list(trace.synthetic(cfg)), list(trace.synthetic(cfg))
    assert a == b
    assert 100 < len(a) < 300
    assert a != list(trace.synthetic(trace.Synthetic(rate=20, duration=10, seed=8)))
    many = list(trace.scaled(a, 3, seed=1))
    assert len(many) == 3 * len(a)
    assert all(x.arrival <= y.arrival for x, y in itertools.pairwise(many))
    copies = [{b >> 44 for r in many for b in r.blocks if (b >> 44) == c} for c in range(3)]
    assert copies == [{0}, {1}, {2}]  # each copy has its own prefix ids
    with pytest.raises(trace.TraceError):
        list(trace.scaled(a, 0))


def test_histogram_quantiles_within_resolution() -> None:
    h = Histogram()
    for v in range(1, 1001):
        h.add(v / 1000)
    assert h.quantile(0.5) == pytest.approx(0.5, rel=0.01)
    assert h.quantile(0.99) == pytest.approx(0.99, rel=0.01)
    marks = list(h.counts)
    h.add(5.0, 10)
    assert h.quantile_since(0.5, marks) == pytest.approx(5.0, rel=0.01)
    assert Histogram().quantile(0.5) is None


def _run(w: Worker, now: float = 0.0) -> tuple[float, list[SimRequest], list[SimRequest]]:
    handoffs: list[SimRequest] = []
    done: list[SimRequest] = []
    end = w.plan(now)
    while end >= 0:
        w.complete(end, Histogram(), handoffs, done)
        now = end
        end = w.plan(now)
    return now, handoffs, done


def test_worker_direct_request_timeline() -> None:
    w = Worker(0, "worker", "node-0", FakePerf(), gpus=1, token_budget=1000)
    req = SimRequest(0, 0.0, 1500, 5, ())
    req.direct = True
    w.waiting.append(req)
    _end, handoffs, done = _run(w)
    # two prefill chunks (1000 + 500 tokens) then 4 decode steps in one segment
    assert req.first_token == pytest.approx(0.01 + 0.1 + 0.01 + 0.05)
    assert req.finished == pytest.approx(req.first_token + 4 * 0.01)
    assert done == [req]
    assert not handoffs
    assert w.kv_used == 0
    assert w.idle


def test_worker_prefill_only_hands_off_and_caches() -> None:
    w = Worker(0, "prefill", "node-0", FakePerf(), gpus=1, block_tokens=100)
    reqs = [SimRequest(i, 0.0, 450, 10, (1, 2, 3, 4)) for i in range(2)]
    for r in reqs:
        w.waiting.append(r)
    _, handoffs, done = _run(w)
    assert handoffs == reqs
    assert not done
    # vLLM caches the full blocks a step will compute when it schedules them (allocate_slots), so
    # the second prompt of the same step hits the first one's (vllm-project/vllm#29387 keeps this
    # for attention layers, only mamba layers wait a step)
    assert (reqs[0].cached_tokens, reqs[1].cached_tokens) == (0, 400)
    later = SimRequest(2, 1.0, 450, 10, (1, 2, 3, 9))
    w.waiting.append(later)
    _run(w, 1.0)
    assert later.cached_tokens == 300
    assert w.kv_used == 3 * 450  # held until the handoff releases it
    w.release(3 * 450)


def test_worker_segment_is_cut_short_by_new_work() -> None:
    w = Worker(0, "decode", "node-0", FakePerf(), gpus=1)
    long = SimRequest(0, 0.0, 100, 100, ())
    w.pending.append(long)
    end = w.plan(0.0)
    assert end == pytest.approx(1.0)  # 100 steps of 10 ms in one event
    short = SimRequest(1, 0.0, 100, 3, ())
    w.pending.append(short)
    cut = w.interrupt(0.255)
    assert cut == pytest.approx(0.26)
    w.complete(cut, Histogram(), [], [])
    _, _, done = _run(w, cut)
    assert short.first_token == pytest.approx(0.27)
    assert short.finished == pytest.approx(0.29)
    assert long.finished == pytest.approx(1.0)
    assert done == [short, long]


def test_worker_waits_for_kv_capacity() -> None:
    w = Worker(0, "decode", "node-0", FakePerf(capacity=300), gpus=1)
    a, b = SimRequest(0, 0.0, 100, 100, ()), SimRequest(1, 0.0, 100, 10, ())
    w.pending.extend([a, b])
    _run(w)
    assert b.first_token >= a.finished  # b did not fit next to a


def test_trace_file_roundtrip_json(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [3]}) + "\n")
    (req,) = trace.load(path)
    assert (req.arrival, req.prompt_tokens, req.blocks) == (0.005, 10, (3,))


@pytest.mark.parametrize(
    ("max_len", "want"),
    [
        (1, (1.0,)),
        (100, (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)),
        (4096, (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)),
    ],
)
def test_token_buckets_are_vllms_1_2_5_series(max_len: int, want: tuple[float, ...]) -> None:
    assert token_buckets(max_len) == want


@pytest.mark.parametrize(
    ("q", "values", "want"),
    [
        (0.5, [], None),
        (0.5, [1.0, 1.0], 0.5),  # the first bucket interpolates from 0
        (0.5, [3.0, 3.0, 3.0, 3.0], 3.5),  # rank 2 of 4 in (2, 5]
        (1.0, [3.0, 30.0], 50.0),
        (0.99, [3.0, 1e9], 100.0),  # past the last bound: the last bound, as Prometheus answers
    ],
)
def test_bucket_quantile_reads_as_histogram_quantile(q: float, values: list[float], want: float | None) -> None:
    assert bucket_quantile(q, values, (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)) == (
        pytest.approx(want) if want is not None else None
    )
