"""The operator-side glue without I/O: spec -> inputs, status round trip, Prometheus failures, metrics."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from xpyd_api.models import DisaggregatedDeploymentSpec, DisaggregatedDeploymentStatus, RatioBand
from xpyd_operator.autoscaling.metrics import AutoscalerMetrics
from xpyd_operator.autoscaling.spec import (
    AutoscaleResult,
    PoolRuntime,
    evaluate,
    managed_pools,
    policy_inputs,
    pool_runtime,
)
from xpyd_operator.autoscaling.types import PoolMetrics, PrometheusError

NOW = 1_800_000_000.0


def spec(**autoscaling: Any) -> DisaggregatedDeploymentSpec:
    return DisaggregatedDeploymentSpec.model_validate(
        {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
            "prefill": {"gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
            "decode": {"gpusPerReplica": 8, "autoscaling": {"minReplicas": 2, "maxReplicas": 16}},
            "autoscaling": {"enabled": True, "intervalSeconds": 15, **autoscaling},
        }
    )


def run(
    metrics: dict[str, PoolMetrics] | PrometheusError,
    status: dict[str, Any] | None = None,
    runtimes: dict[str, PoolRuntime] | None = None,
    now: float = NOW,
) -> AutoscaleResult:
    old = DisaggregatedDeploymentStatus.read(status)
    return evaluate(spec(), old, 3, runtimes or RT, metrics, now)


RT = {"prefill": PoolRuntime(2, 2, 0), "decode": PoolRuntime(4, 4, 0)}
BUSY = {
    "prefill": PoolMetrics(waiting=20.0, running=4.0, reporting=2, sampled_at=NOW - 2),
    "decode": PoolMetrics(waiting=0.0, kv_usage=0.5, reporting=4, sampled_at=NOW - 2),
}


def test_spec_to_inputs() -> None:
    s = spec(ratioBand={"min": 0.25, "max": 1}, targets={"decodeKvUsage": 0.8}, stabilizationSeconds=60)
    inputs = policy_inputs(s, RT, BUSY)
    assert inputs.bounds["decode"].min_replicas == 2
    assert inputs.bounds["prefill"].gpus_per_replica == 8
    assert inputs.ratio_band == RatioBand(min=0.25, max=1.0)
    assert inputs.targets.decode_kv_usage == 0.8
    assert inputs.targets.prefill_waiting_per_replica == 2.0  # the model's default
    assert inputs.behavior.stabilization_seconds == 60
    assert inputs.behavior.stale_after_seconds == 60  # max(60, 4 x 15)
    assert inputs.pools["prefill"].waiting == 20.0
    assert managed_pools(spec(enabled=False)) == {}


# Each spec.autoscaling field with a value and what the policy's inputs must then show.
FIELDS: list[tuple[str, Any, Any]] = [
    ("intervalSeconds", 30, lambda i: i.behavior.stale_after_seconds == 120),
    ("staleAfterSeconds", 45, lambda i: i.behavior.stale_after_seconds == 45),
    ("stabilizationSeconds", 90, lambda i: i.behavior.stabilization_seconds == 90),
    ("ratioBand", {"min": 0.5, "max": 2}, lambda i: (i.ratio_band.min, i.ratio_band.max) == (0.5, 2)),
    ("targets", {"ttftP90Seconds": 0.5}, lambda i: i.targets.ttft_p90_seconds == 0.5),
    ("enabled", False, lambda i: i.bounds == {}),
    ("prometheusUrl", "http://p:9090", lambda i: set(i.bounds) == {"prefill", "decode"}),  # read by the loop
]


def test_every_autoscaling_field_has_a_case() -> None:
    from xpyd_api.models import AutoscalingSpec

    aliases = {f.alias or n for n, f in AutoscalingSpec.model_fields.items()}
    assert aliases == {name for name, _, _ in FIELDS}


@pytest.mark.parametrize(("field", "value", "seen"), FIELDS, ids=[f[0] for f in FIELDS])
def test_each_autoscaling_field_reaches_the_policy(field: str, value: Any, seen: Any) -> None:
    assert seen(policy_inputs(spec(**{field: value}), RT, BUSY))


def test_decision_status_and_restart() -> None:
    first = run(BUSY)
    assert first.desired == {"prefill": 6, "decode": 4}
    assert first.status["prefill"]["reason"] == "scale-up"
    assert first.status["prefill"]["lastScaleTime"] == "2027-01-15T08:00:00Z"
    assert (first.condition.status, first.condition.reason) == ("True", "MetricsFresh")
    assert first.condition.observed_generation == 3
    # A new operator process reads its history back from the status it wrote.
    condition = first.condition.model_dump(by_alias=True, exclude_none=True)
    after = {"autoscaler": first.status, "conditions": [condition]}
    again = run(BUSY, after, {"prefill": PoolRuntime(6, 2, 0), "decode": RT["decode"]}, NOW + 15)
    assert again.decision.state["prefill"].last_direction == 1
    assert again.condition.last_transition_time == first.condition.last_transition_time


def test_prometheus_down_holds_and_is_unhealthy() -> None:
    err = PrometheusError("PrometheusUnreachable", "http://p:9090: ConnectError")
    res = run(err)
    assert res.desired == {"prefill": 2, "decode": 4}
    assert (res.condition.status, res.condition.reason) == ("False", "PrometheusUnreachable")
    assert res.status["decode"]["reason"] == "no-data"


def test_pending_pods_are_counted() -> None:
    def pod(role: str, phase: str, reason: str | None) -> dict[str, Any]:
        conds = [{"type": "PodScheduled", "status": "False", "reason": reason}] if reason else []
        return {
            "metadata": {"labels": {"xpyd.io/role": role}},
            "status": {"phase": phase, "conditions": conds},
        }

    pods = [
        pod("prefill", "Pending", "Unschedulable"),
        pod("prefill", "Pending", None),  # scheduled, still starting
        pod("prefill", "Running", None),
        pod("decode", "Pending", "Unschedulable"),
    ]
    sts = {"spec": {"replicas": 3}, "status": {"readyReplicas": 1}}
    assert pool_runtime(sts, pods, "prefill") == PoolRuntime(3, 1, 1)


def _sts(replicas: int, ready: int, surge: str | None) -> dict[str, Any]:
    notes = {"xpyd.io/rollout-surge": surge} if surge is not None else {}
    return {"metadata": {"annotations": notes}, "spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def _pod(ordinal: int, unschedulable: bool = False) -> dict[str, Any]:
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}] if unschedulable else []
    phase = "Pending" if unschedulable else "Running"
    meta = {"name": f"dd-decode-{ordinal}", "labels": {"xpyd.io/role": "decode"}}
    return {"metadata": meta, "status": {"phase": phase, "conditions": conds}}


# An engine change's lockstep writes the pool's size plus its surge on the StatefulSet (and the surge
# in an annotation): the autoscaler sizes the pool, not the roll.
SURGED: list[tuple[str, dict[str, Any], list[dict[str, Any]], PoolRuntime]] = [
    ("no roll", _sts(4, 4, None), [_pod(i) for i in range(4)], PoolRuntime(4, 4, 0)),
    ("surge 1, all ready", _sts(5, 5, "1"), [_pod(i) for i in range(5)], PoolRuntime(4, 4, 0)),
    ("surge 2, one old pod replaced", _sts(6, 5, "2"), [_pod(i) for i in range(6)], PoolRuntime(4, 4, 0)),
    ("surge 1, pool short", _sts(5, 3, "1"), [_pod(i) for i in range(5)], PoolRuntime(4, 3, 0)),
    ("surge pod unplaced", _sts(5, 4, "1"), [*(_pod(i) for i in range(4)), _pod(4, True)], PoolRuntime(4, 4, 0)),
    ("pool pod unplaced", _sts(5, 3, "1"), [*(_pod(i) for i in range(3)), _pod(3, True), _pod(4)],
     PoolRuntime(4, 3, 1)),
    ("surge dropped (0)", _sts(4, 4, "0"), [_pod(i) for i in range(4)], PoolRuntime(4, 4, 0)),
    ("garbled note", _sts(4, 4, "lots"), [_pod(i) for i in range(4)], PoolRuntime(4, 4, 0)),
    ("note above replicas", _sts(1, 1, "3"), [_pod(0)], PoolRuntime(0, 0, 0)),
]  # fmt: skip


@pytest.mark.parametrize(("sts", "pods", "want"), [c[1:] for c in SURGED], ids=[c[0] for c in SURGED])
def test_a_surged_pool_is_seen_at_its_own_size(sts: dict[str, Any], pods: list[dict[str, Any]],
                                               want: PoolRuntime) -> None:  # fmt: skip
    assert pool_runtime(sts, pods, "decode") == want


def test_a_roll_s_surge_is_not_taken_for_a_resize() -> None:
    """Mid-roll the StatefulSet runs 4 + 1: the policy holds the pool at 4 instead of adopting 5 (and the
    lockstep surging again on top, each period)."""
    quiet = {r: PoolMetrics(waiting=0.0, kv_usage=0.5, reporting=5, sampled_at=NOW - 2) for r in ("prefill", "decode")}
    first = run(quiet, runtimes={"prefill": PoolRuntime(2, 2, 0), "decode": PoolRuntime(4, 4, 0)})
    assert first.desired["decode"] == 4
    after = {"autoscaler": first.status}
    rolling = {
        "prefill": pool_runtime(_sts(3, 3, "1"), [], "prefill"),
        "decode": pool_runtime(_sts(5, 5, "1"), [], "decode"),
    }
    again = run(quiet, after, rolling, NOW + 15)
    assert again.desired["decode"] == 4 and again.status["decode"]["replicas"] == 4


def test_metrics_exported() -> None:
    reg = CollectorRegistry()
    m = AutoscalerMetrics(reg)
    res = run(BUSY)
    m.record("ns", "llama", res.decision, {"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4})
    labels = {"namespace": "ns", "deployment": "llama", "role": "prefill"}
    assert reg.get_sample_value("xpyd_autoscaler_desired_replicas", labels) == 6
    assert reg.get_sample_value("xpyd_autoscaler_decision_reason", {**labels, "reason": "scale-up"}) == 1
    assert reg.get_sample_value("xpyd_autoscaler_scale_events_total", {**labels, "direction": "up"}) == 1
    assert reg.get_sample_value("xpyd_autoscaler_healthy", {"namespace": "ns", "deployment": "llama"}) == 1
