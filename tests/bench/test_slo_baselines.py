"""The saturation and Planner-style baselines the SLO frontier compares with, and its reactive bound: their rules,
table-driven."""

from __future__ import annotations

from typing import Any

import pytest
from bench.autoscaler.slo_frontier import bench_spec, dominates, resolution, verdict
from bench.baselines.autoscalers import PlannerPolicy, ReactiveBound, SaturationPolicy, profile

from xpyd_api.models import DisaggregatedDeploymentSpec, SloSpec
from xpyd_operator.autoscaling.slo import SloPolicy
from xpyd_operator.autoscaling.slomodel import replica_perfs
from xpyd_operator.autoscaling.types import PolicyInputs, PoolBounds, PoolObservation, PoolState

NOW = 1_000.0
BOUNDS = {"prefill": PoolBounds(1, 16), "decode": PoolBounds(1, 16)}
SLO = SloSpec(ttft_seconds=1.0, itl_seconds=0.05)
# a replica: 10k prompt tokens/s, decode step 5 ms + 0.1 ms per sequence
PROFILE = profile(lambda n: n / 10_000.0, lambda b, ctx: 0.005 + 0.0001 * b, 1_000_000)


def obs(n: int, **kw: Any) -> PoolObservation:
    kw.setdefault("ready", n)
    kw.setdefault("sampled_at", NOW)
    kw.setdefault("waiting", 0.0)
    return PoolObservation(replicas=n, **kw)


@pytest.mark.parametrize(
    ("o", "want"),
    [
        (obs(2, kv_usage=0.5), 2),  # not saturated: holds (window max)
        (obs(2, kv_usage=0.9), 3),  # KV >= 0.8: one more at least
        (obs(2, kv_usage=0.1, waiting=30.0), 6),  # 30 queued / 5 per replica
        (obs(2, kv_usage=0.1, waiting=10.0), 3),  # exactly 5 per replica is saturated
    ],
)
def test_saturation_rule(o: PoolObservation, want: int) -> None:
    d = SaturationPolicy().decide(PolicyInputs({"decode": o}, BOUNDS), {}, NOW)
    assert d.pools["decode"].desired == want


def test_saturation_rejects_bad_thresholds() -> None:
    with pytest.raises(ValueError, match="saturation thresholds"):
        SaturationPolicy(kv_threshold=1.5)


def test_profile_interpolates() -> None:
    assert PROFILE.prefill_throughput(3000) == pytest.approx(10_000.0)
    assert PROFILE.itl(64, 1000) == pytest.approx(0.005 + 0.0064)
    # the largest profiled batch with ITL <= 20 ms is 128 (17.8 ms): 128 / 0.0178 tokens/s
    assert PROFILE.decode_throughput(0.02, 1000) == pytest.approx(128 / 0.0178)


def planner_inputs(rate: float, isl: float = 2000.0, osl: float = 200.0) -> PolicyInputs:
    pre = obs(1, prompt_tokens_rate=rate * isl, request_rate=rate)
    dec = obs(1, generation_tokens_rate=rate * osl, running=1.0, kv_usage=0.1)
    return PolicyInputs({"prefill": pre, "decode": dec}, BOUNDS, slo=SLO)


@pytest.mark.parametrize(("rate", "prefill", "decode"), [(2.0, 1, 1), (20.0, 4, 1), (40.0, 8, 1), (80.0, 16, 2)])
def test_planner_sizes_from_the_profile(rate: float, prefill: int, decode: int) -> None:
    profiles = {"prefill": PROFILE, "decode": PROFILE}
    d = PlannerPolicy(profiles).decide(planner_inputs(rate), {}, NOW)
    assert (d.pools["prefill"].desired, d.pools["decode"].desired) == (prefill, decode)


def test_planner_waits_between_adjustments_and_holds_without_data() -> None:
    profiles = {"prefill": PROFILE, "decode": PROFILE}
    st = {"prefill": PoolState(fresh_since=NOW - 10), "decode": PoolState(fresh_since=NOW - 10)}
    d = PlannerPolicy(profiles, interval_s=60).decide(planner_inputs(40.0), st, NOW)
    assert d.pools["prefill"].desired == 1 and d.pools["prefill"].reason == "hold"
    blind = PolicyInputs({"prefill": obs(3), "decode": obs(2)}, BOUNDS, slo=SLO)
    d = PlannerPolicy(profiles).decide(blind, {}, NOW)
    assert (d.pools["prefill"].desired, d.pools["decode"].desired) == (3, 2)


def test_the_reactive_bound_grows_to_the_bound_where_the_slo_policy_grows() -> None:
    spec = DisaggregatedDeploymentSpec.model_validate(
        {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
            "topology": {"kind": "HGX-B200"},
            "prefill": {"replicas": 2, "gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
            "decode": {"replicas": 2, "gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
        }
    )
    perf = replica_perfs(spec)
    prefill = obs(2, prompt_tokens_rate=400_000.0, request_rate=200.0, prefix_hit_ratio=0.0)
    decode = obs(2, running=20.0, kv_usage=0.01)
    inputs = PolicyInputs({"prefill": prefill, "decode": decode}, BOUNDS, slo=SLO, perf=perf)
    slo = SloPolicy().decide(inputs, {}, NOW)
    bound = ReactiveBound().decide(inputs, {}, NOW)
    assert 2 < slo.pools["prefill"].desired < 16  # the SLO policy grows prefill by its model ...
    assert bound.pools["prefill"].desired == 16 == bound.state["prefill"].last_desired  # ... the bound to the max
    assert bound.pools["decode"] == slo.pools["decode"]  # where it would not grow, it is the SLO policy


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ((9.90, 1.0), (10.0, 1.0), True),  # cheaper by more than the tie, as good
        ((9.98, 1.0), (10.0, 1.0), False),  # cheaper by less than the tie: the same cost
        ((10.02, 0.999), (10.0, 0.99), True),  # the same cost, better attainment
        ((9.0, 0.98), (10.0, 0.99), False),  # cheaper but worse: neither dominates
        ((10.0, 1.0), (10.0, 1.0), False),  # equal
    ],
)
def test_domination_counts_costs_within_a_decision_step_as_equal(
    a: tuple[float, float], b: tuple[float, float], want: bool
) -> None:
    def row(gpu_hours: float, attainment: float) -> dict[str, float]:
        return {"gpu_hours": gpu_hours, "attainment": attainment}

    assert dominates(row(*a), row(*b), tie=0.05) is want


def test_the_tie_is_one_replica_for_one_interval() -> None:
    spec = bench_spec(0.99)  # TP8 replicas, decided every 15 s
    assert resolution(spec) == pytest.approx(8 * 15 / 3600)


def frontier_row(policy: str, gpu_hours: float, attainment: float, default: bool = False) -> dict[str, Any]:
    return {
        "policy": policy,
        "label": policy,
        "default": default,
        "gpu_hours": gpu_hours,
        "attainment": attainment,
        "meets": attainment >= 0.99,
    }


@pytest.mark.parametrize(
    ("threshold", "said", "unsaid"),
    [
        (0.90, "out of reach for a policy that reacts", "cheapest baseline"),  # nothing reactive meets it
        (1.00, "cheapest baseline meeting it: xpyd 50.0", "out of reach"),  # a baseline does: not out of reach
    ],
)
def test_a_miss_is_out_of_reach_only_where_no_policy_meets_the_goal(threshold: float, said: str, unsaid: str) -> None:
    rows = [
        frontier_row("static", 80.0, 1.0),
        frontier_row("reactive", 30.0, 0.98),
        frontier_row("slo", 18.0, 0.95, default=True),
        frontier_row("xpyd", 50.0, threshold),
    ]
    text = verdict(rows)
    assert said in text and unsaid not in text
