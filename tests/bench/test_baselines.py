"""The peers' rules the benchmarks compare with: table-driven, and registered only on request."""

from __future__ import annotations

import pytest
from bench.baselines import ROUTERS, SCALERS, KedaPolicy, LlmDPolicy, SGLangCachePolicy, register

from xpyd_operator.autoscaling.policy import AUTOSCALERS
from xpyd_operator.autoscaling.types import PolicyInputs, PoolBounds, PoolObservation, PoolState
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import RouteRequest, WorkerState
from xpyd_router.policy.registry import POLICIES

BLOCKS = list(range(100, 140))  # a 40-block prompt
BOUNDS = {"prefill": PoolBounds(1, 10)}


def w(name: str, **load: float) -> WorkerState:
    return WorkerState(name=name, role="prefill", **load)  # type: ignore[arg-type]


def index_with(**cached: int) -> PrefixIndex:
    index = PrefixIndex()
    for name, count in cached.items():
        index.record(name, BLOCKS[:count])
    return index


@pytest.mark.parametrize(
    ("workers", "cached", "want"),
    [
        ([w("a"), w("b")], {"a": 40}, "a"),  # prefix 3 beats nothing
        ([w("a", waiting=10), w("b")], {"a": 40}, "a"),  # 3 + 0 + 2 = 5 > 0 + 2 + 2 = 4
        ([w("a", waiting=10, kv_usage=0.9), w("b")], {"a": 40}, "b"),  # 3.2 < 4
        ([w("a", waiting=10), w("b")], {"a": 10}, "b"),  # 0.75 + 2 < 4
    ],
)
def test_llm_d_weighted_scores(workers: list[WorkerState], cached: dict[str, int], want: str) -> None:
    decision = LlmDPolicy().choose_prefill(RouteRequest(BLOCKS, 0), workers, index_with(**cached))
    assert decision.worker == want


@pytest.mark.parametrize(
    ("workers", "cached", "want", "reason"),
    [
        ([w("a"), w("b")], {"a": 20, "b": 5}, "a", "sglang-cache"),
        ([w("a"), w("b")], {"a": 10, "b": 5}, "b", "sglang-smallest-tree"),  # 25% <= 30%: smaller tree
        ([w("a", inflight=100), w("b", inflight=10)], {"a": 40}, "b", "sglang-balance"),
        ([w("a", inflight=60), w("b", inflight=10)], {"a": 40}, "a", "sglang-cache"),  # 50 <= 64: no balance
    ],
)
def test_sglang_cache_aware(workers: list[WorkerState], cached: dict[str, int], want: str, reason: str) -> None:
    decision = SGLangCachePolicy().choose_prefill(RouteRequest(BLOCKS, 0), workers, index_with(**cached))
    assert (decision.worker, decision.reason) == (want, reason)


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_peer_routers_plan_both_hops_and_one_hop(name: str) -> None:
    policy = ROUTERS[name]()
    req = RouteRequest(BLOCKS, key=5)
    decode = WorkerState(name="d1", role="decode")
    plan = policy.plan(req, [w("p1"), w("p2")], [decode], PrefixIndex())
    assert (plan.decode.worker, plan.prefill.worker if plan.prefill else None) in {("d1", "p1"), ("d1", "p2")}
    colocated = [WorkerState(name="c1", role="worker")]
    assert policy.plan(req, [], colocated, PrefixIndex()).prefill is None


@pytest.mark.parametrize(
    ("n", "waiting", "window_recs", "want"),
    [
        (1, 12.0, (), 3),  # ceil(12 / 5)
        (2, 10.5, (), 2),  # within HPA's 10 % tolerance
        (2, 100.0, (), 6),  # at most max(100 %, 4 pods) up
        (4, 0.0, ((100.0, 4),), 4),  # down only to the window's highest recommendation
        (4, 0.0, ((100.0, 2),), 2),  # then all the way, no step limit
        (4, None, (), 4),  # no metric: hold
    ],
)
def test_keda_rule(n: int, waiting: float | None, window_recs: tuple[tuple[float, int], ...], want: int) -> None:
    o = PoolObservation(replicas=n, ready=n, waiting=waiting, sampled_at=200.0)
    inputs = PolicyInputs(pools={"prefill": o}, bounds=BOUNDS)
    d = KedaPolicy().decide(inputs, {"prefill": PoolState(recommendations=window_recs)}, 200.0)
    assert d.pools["prefill"].desired == want


def test_keda_rule_follows_a_spike_and_returns() -> None:
    policy, n, sizes = KedaPolicy(), 2, []
    state: dict[str, PoolState] = {}
    for tick in range(200):
        t = 15.0 * tick
        waiting = 30.0 if 600 <= t < 1200 else 0.0
        o = PoolObservation(replicas=n, ready=n, waiting=waiting, sampled_at=t)
        d = policy.decide(PolicyInputs(pools={"prefill": o}, bounds=BOUNDS), state, t)
        state, n = dict(d.state), d.pools["prefill"].desired
        sizes.append(n)
    assert max(sizes) == 6
    assert sizes[-1] == 1


def test_register_adds_the_peers_by_name_only_when_asked() -> None:
    before = (dict(POLICIES), dict(AUTOSCALERS))
    assert not set(ROUTERS) & set(POLICIES)
    assert not set(SCALERS) & set(AUTOSCALERS)
    try:
        register()
        assert {"llm-d", "sglang"} <= set(POLICIES)
        assert "keda" in AUTOSCALERS
    finally:
        POLICIES.clear()
        POLICIES.update(before[0])
        AUTOSCALERS.clear()
        AUTOSCALERS.update(before[1])
