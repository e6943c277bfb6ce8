"""The cache-routing suite's parts: workload shapes share exactly their prefixes, and the peers' rules."""

from __future__ import annotations

import pytest
from bench.cache import report, suite
from bench.cache import workloads as wl
from bench.cache.peers import PEERS, TreeCachePolicy, VllmKvAwarePolicy, register

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import RouteRequest, WorkerState
from xpyd_router.policy.registry import POLICIES
from xpyd_sim.trace import TraceRequest

BLOCKS = list(range(100, 140))  # a 40-block prompt


def w(name: str, **load: float) -> WorkerState:
    return WorkerState(name=name, role="worker", **load)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", sorted(wl.SYNTHETIC))
def test_shapes_are_deterministic_ordered_and_block_consistent(shape: str) -> None:
    cfg = wl.Shape(rate=10, duration=60, seed=3)
    load = wl.SYNTHETIC[shape](cfg)
    assert load == wl.SYNTHETIC[shape](cfg)
    assert load != wl.SYNTHETIC[shape](wl.Shape(rate=10, duration=60, seed=4))
    assert [r.arrival for r in load] == sorted(r.arrival for r in load)
    for r in load:
        assert len(r.blocks) == r.prompt_tokens // cfg.block_tokens  # full blocks of the prompt only
    seen: dict[int, tuple[int, ...]] = {}
    for r in load:  # chained ids: one id always has the same prefix before it
        for i, b in enumerate(r.blocks):
            assert seen.setdefault(b, r.blocks[:i]) == r.blocks[:i]


@pytest.mark.parametrize(("shape", "low", "high"), [("chat", 0.7, 0.95), ("rag", 0.2, 0.5), ("agent", 0.85, 0.99)])
def test_shapes_reuse_what_they_are_meant_to(shape: str, low: float, high: float) -> None:
    load = wl.SYNTHETIC[shape](wl.Shape(rate=10, duration=120))
    assert low < wl.ideal_hit_ratio(load, 64) < high
    assert wl.working_set_tokens(load, 64) > 0


def test_working_set_counts_only_reused_blocks() -> None:
    once = [TraceRequest(float(i), 128, 1, (10 * i, 10 * i + 1)) for i in range(5)]
    assert wl.working_set_tokens(once, 64) == 0
    twice = [*once, TraceRequest(9.0, 128, 1, (0, 1))]
    assert wl.working_set_tokens(twice, 64) == 2 * 64


def tree(**cached: int) -> TreeCachePolicy:
    policy = TreeCachePolicy()
    for name, count in cached.items():
        policy.tree.record(name, BLOCKS[:count])
    return policy


@pytest.mark.parametrize(
    ("workers", "cached", "want", "reason"),
    [
        ([w("a"), w("b")], {"b": 20}, "b", "cache"),  # a match over 30% of the prompt
        ([w("a"), w("b")], {"b": 10}, "a", "smallest-tree"),  # 25%: to the worker with the least text
        ([w("a", inflight=100), w("b", inflight=10)], {"a": 40}, "b", "balance"),  # imbalanced: least loaded
        ([w("a", inflight=60), w("b", inflight=10)], {"a": 40}, "a", "cache"),  # 50 apart: not imbalanced yet
        ([w("a", running=500), w("b")], {"a": 40}, "a", "cache"),  # scraped load is not what it counts
    ],
)
def test_sglang_cache_aware_rule(workers: list[WorkerState], cached: dict[str, int], want: str, reason: str) -> None:
    policy = tree(**cached)
    decision = policy.choose_prefill(RouteRequest(BLOCKS, key=1, prompt_chars=40 * 256), workers, PrefixIndex())
    assert (decision.worker, decision.reason) == (want, reason)
    assert policy.tree.match(BLOCKS)[want] == 40  # its tree learns every decision, never an eviction


def test_vllm_kv_aware_follows_events_and_its_own_guesses_for_two_seconds() -> None:
    now = [0.0]
    policy = VllmKvAwarePolicy()
    policy.use_clock(lambda: now[0])
    events = PrefixIndex()
    events.record("b", BLOCKS[:5])
    workers = [w("a"), w("b"), w("c", inflight=2)]
    first = policy.choose_prefill(RouteRequest(BLOCKS, key=1), workers, events)
    assert (first.worker, first.reason) == ("b", "prefix")
    other = RouteRequest(list(range(900, 920)), key=2)
    cold = policy.choose_prefill(other, [w("a", inflight=1), w("b"), w("c", inflight=2)], PrefixIndex())
    assert (cold.worker, cold.reason) == ("b", "least-load")  # nobody has any of it: least loaded
    now[0] = 1.0
    again = policy.choose_prefill(other, [w("a"), w("b", inflight=5), w("c")], PrefixIndex())
    assert again.worker == "b"  # its speculative entry, whatever the load
    now[0] = 3.5
    late = policy.choose_prefill(other, [w("a"), w("b", inflight=5), w("c")], PrefixIndex())
    assert (late.worker, late.reason) == ("a", "least-load")  # expired


def test_peers_register_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("xpyd_router.policy.registry.POLICIES", dict(POLICIES))
    register()
    from xpyd_router.policy import registry

    assert set(PEERS) <= set(registry.POLICIES)
    assert not set(PEERS) & set(POLICIES)  # the product's registry knows none of them


def _entry(name: str, ours: float, peer: float, p99: float = 1.0) -> dict[str, object]:
    rows = [
        {"label": "xpyd kv-aware + KV events", "peer": False, "prefix_hit_ratio": ours, "ttft_p99_s": 0.5},
        {"label": "sglang-router cache_aware", "peer": True, "prefix_hit_ratio": peer, "ttft_p99_s": p99},
        {"label": "round-robin", "peer": False, "prefix_hit_ratio": 0.9, "ttft_p99_s": 0.1},
    ]
    for r in rows:
        r |= {"ttft_p50_s": 0.1, "slo_attainment": 1.0, "imbalance": 1.0}
    entry: dict[str, object] = {"scenario": name, "shape": "rag", "deployment": "8B 4W", "rate": 1.0,
                                "working_set_tokens": 1, "cache_tokens_per_worker": 1, "cache_vs_working_set": 1.0,
                                "ideal_hit_ratio": 0.5, "rows": rows}  # fmt: skip
    return entry | suite.verdict(entry)


@pytest.mark.parametrize(
    ("ours", "peer", "p99", "hit_ok", "p99_ok", "note"),
    [
        (0.30, 0.30, 1.0, True, True, False),  # a tie passes; the reference router is not a peer
        (0.30, 0.31, 1.0, False, True, True),  # a miss prints its note
        (0.31, 0.30, 0.4, True, False, True),
    ],
)
def test_verdict_names_the_best_peer_and_explains_a_miss(
    ours: float, peer: float, p99: float, hit_ok: bool, p99_ok: bool, note: bool
) -> None:
    entry = _entry("rag-large", ours, peer, p99)
    assert (entry["hit_ok"], entry["p99_ok"]) == (hit_ok, p99_ok)
    assert entry["best_peer_hit_label"] == "sglang-router cache_aware"
    md = report.suite_md({"suite": [entry]}, "# t")
    assert f"{100 * (ours - peer):+.2f}" in md
    assert ("## Rows that miss, and why" in md) == note
