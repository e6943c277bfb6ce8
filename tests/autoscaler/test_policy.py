"""Table-driven tests of the xpyd scaling policy: signals, bounds, behaviour, missing data."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_api.models import AutoscalingTargets
from xpyd_operator.autoscaling.policy import XpydPolicy, recommend
from xpyd_operator.autoscaling.types import (
    Behavior,
    PolicyInputs,
    PoolBounds,
    PoolObservation,
    PoolState,
    Targets,
)

NOW = 10_000.0
OLD = NOW - 1_000.0  # long enough ago for every window


def obs(replicas: int, **kw: Any) -> PoolObservation:
    kw.setdefault("ready", replicas)
    kw.setdefault("sampled_at", NOW - 5)
    return PoolObservation(replicas=replicas, **kw)


def settled(*recs: tuple[float, int], **kw: Any) -> PoolState:
    """A pool that has seen fresh data for a long time and last asked for its current size."""
    return PoolState(recommendations=recs, fresh_since=OLD, **kw)


@pytest.mark.parametrize(
    ("role", "o", "want"),
    [
        ("prefill", obs(2, waiting=10.0), 5),  # 10 waiting / 2 per replica
        ("prefill", obs(2, waiting=4.4), 2),  # 2.2 replicas' worth is within 10 % of 2
        ("prefill", obs(2, waiting=4.6), 3),
        ("prefill", obs(3, waiting=0.0), 0),
        ("prefill", obs(2, waiting=0.0, running=12.0), 0),  # no running target set: running ignored
        ("prefill", obs(2, waiting=1.0, ttft_p90=3.0), 3),  # TTFT SLO breached with a queue: one more
        ("prefill", obs(2, waiting=0.0, ttft_p90=3.0), 0),  # breached but no queue: not prefill's fault
        ("prefill", obs(4, ready=2, waiting=1.0, ttft_p90=3.0), 3),  # 2 starting: one more than serve, not past them
        ("decode", obs(4, waiting=0.0, kv_usage=0.9), 6),  # 4 x 0.9 / 0.7 = 5.14
        ("decode", obs(4, waiting=0.0, kv_usage=0.35), 2),
        ("decode", obs(4, waiting=9.0, kv_usage=0.35), 9),  # queue on decode: 1 per replica
        ("decode", obs(4, waiting=0.0, kv_usage=0.5, itl_p90=0.2), 5),  # ITL SLO breached: one more
        ("decode", obs(6, ready=4, waiting=0.0, kv_usage=0.5, itl_p90=0.2), 5),  # ... than serve (the p90 lags)
        ("worker", obs(2, waiting=10.0, kv_usage=0.1), 5),  # colocated: the larger of both
        ("worker", obs(2, waiting=0.0, kv_usage=0.98), 3),
    ],
)
def test_recommendation_signals(role: str, o: PoolObservation, want: int) -> None:
    assert recommend(role, o, Targets())[0] == want


@pytest.mark.parametrize(
    ("o", "targets", "want", "signal"),
    [
        (obs(2, waiting=0.0, running=12.0), Targets(prefill_running_per_replica=4.0), 3, "running"),
        (
            obs(2, waiting=0.0, prompt_tokens_rate=50_000.0),
            Targets(prefill_tokens_per_second_per_replica=10_000.0, prefill_utilization=0.5),
            10,
            "prompt-tokens",
        ),
    ],
)
def test_optional_prefill_signals(o: PoolObservation, targets: Targets, want: int, signal: str) -> None:
    rec, why = recommend("prefill", o, targets)
    assert (rec, why.split(":")[0]) == (want, signal)


B = PoolBounds(min_replicas=1, max_replicas=10)

# (case, observation, prior state, bounds, desired, reason)
SINGLE_POOL = [
    ("up-fast", obs(2, waiting=20.0), PoolState(), B, 6, "scale-up"),  # wants 10, at most +max(4, 2)
    ("up-big-pool", obs(8, waiting=40.0), PoolState(), PoolBounds(1, 40), 16, "scale-up"),  # doubles
    ("up-capped-by-max", obs(2, waiting=100.0), PoolState(), PoolBounds(1, 5), 5, "scale-up"),
    ("hold-in-tolerance", obs(2, waiting=4.2), settled(), B, 2, "hold"),
    ("below-min-raised", obs(0, waiting=None, sampled_at=None), PoolState(), PoolBounds(2, 5), 2, "bounds"),
    ("above-max-lowered", obs(9, waiting=50.0), PoolState(), PoolBounds(1, 6), 6, "bounds"),
    ("missing-holds", obs(4, waiting=None, sampled_at=None), settled(), B, 4, "no-data"),
    ("stale-holds", obs(4, waiting=0.0, sampled_at=NOW - 120), settled(), B, 4, "no-data"),
    ("partial-no-down", obs(4, waiting=0.0, ready=3, reporting=1), settled(), B, 4, "hold"),
    ("partial-may-grow", obs(4, waiting=30.0, ready=3, reporting=1), PoolState(), B, 8, "scale-up"),
    ("pending-stops-growth", obs(4, waiting=40.0, unschedulable=2), PoolState(), B, 4, "pending-pods"),
    ("down-one-step", obs(8, waiting=0.0), settled(), B, 6, "scale-down"),  # floor(8 x 0.25) per step
    ("down-small-pool", obs(3, waiting=0.0), settled(), B, 2, "scale-down"),  # at least 1
    ("down-not-below-min", obs(3, waiting=0.0), settled(), PoolBounds(3, 10), 3, "hold"),
    ("down-to-window-max", obs(8, waiting=0.0), settled((NOW - 100, 7)), B, 7, "scale-down"),
    ("window-max-holds", obs(8, waiting=0.0), settled((NOW - 100, 8)), B, 8, "stabilizing"),
    ("old-recs-expire", obs(8, waiting=0.0), settled((NOW - 400, 8)), B, 6, "scale-down"),
    ("too-little-data", obs(8, waiting=0.0), PoolState(fresh_since=NOW - 100), B, 8, "stabilizing"),
    ("no-history", obs(8, waiting=0.0), PoolState(), B, 8, "stabilizing"),
    ("cooldown", obs(8, waiting=0.0), settled(last_scale_down_time=NOW - 10), B, 8, "cooldown"),
    (
        "flap-guard-down",
        obs(8, waiting=0.0),
        settled(last_direction=1, last_direction_change_time=NOW - 60),
        B,
        8,
        "flap-guard",
    ),
    (
        "flap-guard-up",
        obs(4, waiting=20.0),
        settled(last_direction=-1, last_direction_change_time=NOW - 60, last_desired=4),
        B,
        4,
        "flap-guard",
    ),
    (
        "slo-breach-overrides-flap-guard",
        obs(4, waiting=20.0, ttft_p90=5.0),
        settled(last_direction=-1, last_direction_change_time=NOW - 60, last_desired=4),
        B,
        8,
        "scale-up",
    ),
    (
        "turn-allowed-after-window",
        obs(4, waiting=20.0),
        settled(last_direction=-1, last_direction_change_time=NOW - 400, last_desired=4),
        B,
        8,
        "scale-up",
    ),
    # A user resized the pool from 4 (our last ask) to 8: a new target, held for a full window.
    ("manual-edit-held", obs(8, waiting=0.0), settled(last_desired=4), B, 8, "stabilizing"),
    (
        "manual-edit-may-grow",
        obs(8, waiting=40.0),
        settled(last_desired=4),
        PoolBounds(1, 40),
        16,
        "scale-up",
    ),
]


@pytest.mark.parametrize(
    ("o", "state", "bounds", "want", "reason"),
    [c[1:] for c in SINGLE_POOL],
    ids=[c[0] for c in SINGLE_POOL],
)
def test_single_pool_decision(o: PoolObservation, state: PoolState, bounds: PoolBounds, want: int, reason: str) -> None:
    inputs = PolicyInputs(pools={"prefill": o}, bounds={"prefill": bounds})
    d = XpydPolicy().decide(inputs, {"prefill": state}, NOW).pools["prefill"]
    assert (d.desired, d.reason) == (want, reason), d.message


@pytest.mark.parametrize(
    ("o", "healthy", "reason"),
    [
        (obs(2, waiting=1.0), True, "MetricsFresh"),
        (obs(2, sampled_at=None), False, "MetricsMissing"),
        (obs(2, waiting=1.0, sampled_at=NOW - 61), False, "MetricsStale"),
        (obs(2, waiting=None), False, "MetricsMissing"),
        (obs(3, waiting=1.0, reporting=2), False, "MetricsPartial"),
    ],
)
def test_health(o: PoolObservation, healthy: bool, reason: str) -> None:
    inputs = PolicyInputs(pools={"prefill": o}, bounds={"prefill": B})
    d = XpydPolicy().decide(inputs, {}, NOW)
    assert (d.healthy, d.health_reason) == (healthy, reason)


def test_decode_needs_kv_usage() -> None:
    inputs = PolicyInputs(pools={"decode": obs(4, waiting=0.0)}, bounds={"decode": B})
    d = XpydPolicy().decide(inputs, {"decode": settled()}, NOW)
    assert (d.healthy, d.pools["decode"].desired) == (False, 4)


def test_decision_records_history() -> None:
    inputs = PolicyInputs(pools={"prefill": obs(2, waiting=20.0)}, bounds={"prefill": B})
    st = XpydPolicy().decide(inputs, {}, NOW).state["prefill"]
    assert (st.last_desired, st.last_scale_time, st.last_direction) == (6, NOW, 1)
    assert st.recommendations == ((NOW, 10),)
    assert PoolState.from_dict(st.to_dict()) == st


@pytest.mark.parametrize(
    "bad",
    [
        lambda: PoolObservation(replicas=-1),
        lambda: PoolObservation(replicas=1, kv_usage=1.5),
        lambda: Targets(decode_kv_usage=0),
        lambda: Targets(prefill_utilization=1.5),
        lambda: Targets(tolerance=-0.1),
        lambda: Behavior(scale_down_max_fraction=0),
        lambda: PolicyInputs(pools={"decode": obs(1)}, bounds={"prefill": B}),
    ],
)
def test_bad_input_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"."):
        bad()


def test_targets_are_the_spec_targets_with_their_defaults() -> None:
    """A field of spec.autoscaling.targets is a field of the policy's Targets, with the same default."""
    spec_fields = AutoscalingTargets.model_fields
    assert set(spec_fields) <= set(Targets.model_fields)
    assert {n: f.default for n, f in spec_fields.items()} == {n: getattr(Targets(), n) for n in spec_fields}
    assert set(Targets.model_fields) - set(spec_fields) == {"tolerance"}  # the policy's own hold band


def test_junk_history_reads_as_empty() -> None:
    assert PoolState.from_dict({"recommendations": [["x", 1]]}) == PoolState()
