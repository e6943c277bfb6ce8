"""The operator-side glue without I/O: spec -> inputs, status round trip, Prometheus failures, metrics."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from xpyd_operator.autoscaler import evaluate
from xpyd_operator.autoscaling_metrics import AutoscalerMetrics
from xpyd_operator.autoscaling_prometheus import PoolMetrics, PrometheusError
from xpyd_operator.autoscaling_spec import PoolRuntime, managed_pools, policy_inputs, pool_runtime

NOW = 1_800_000_000.0


def dd(status: dict[str, Any] | None = None, **autoscaling: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "ns", "generation": 3},
        "spec": {
            "prefill": {"gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
            "decode": {"gpusPerReplica": 8, "autoscaling": {"minReplicas": 2, "maxReplicas": 16}},
            "autoscaling": {"enabled": True, "intervalSeconds": 15, **autoscaling},
        },
        "status": status or {},
    }


RT = {"prefill": PoolRuntime(2, 2, 0), "decode": PoolRuntime(4, 4, 0)}
BUSY = {
    "prefill": PoolMetrics(waiting=20.0, running=4.0, reporting=2, sampled_at=NOW - 2),
    "decode": PoolMetrics(waiting=0.0, kv_usage=0.5, reporting=4, sampled_at=NOW - 2),
}


def test_spec_to_inputs() -> None:
    spec = dd(ratioBand={"min": 0.25, "max": 1}, targets={"decodeKvUsage": 0.8})["spec"]
    inputs = policy_inputs(spec, RT, BUSY)
    assert inputs.bounds["decode"].min_replicas == 2
    assert inputs.bounds["prefill"].gpus_per_replica == 8
    assert inputs.ratio_band == (0.25, 1.0)
    assert inputs.targets.decode_kv_usage == 0.8
    assert inputs.pools["prefill"].waiting == 20.0
    assert managed_pools({**spec, "autoscaling": {"enabled": False}}) == {}


def test_unknown_target_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown spec.autoscaling.targets keys \['queue'\]"):
        policy_inputs(dd(targets={"queue": 1})["spec"], RT, BUSY)


def test_decision_status_and_restart() -> None:
    first = evaluate(dd(), RT, BUSY, NOW)
    assert first.desired == {"prefill": 6, "decode": 4}
    assert first.status["prefill"]["reason"] == "scale-up"
    assert first.status["prefill"]["lastScaleTime"] == "2027-01-15T08:00:00Z"
    assert (first.condition["status"], first.condition["reason"]) == ("True", "MetricsFresh")
    # A new operator process reads its history back from the status it wrote.
    after = {"autoscaler": first.status, "conditions": [first.condition]}
    rt = {"prefill": PoolRuntime(6, 2, 0), "decode": RT["decode"]}
    again = evaluate(dd(after), rt, BUSY, NOW + 15)
    assert again.decision.state["prefill"].last_direction == 1
    assert again.condition["lastTransitionTime"] == first.condition["lastTransitionTime"]


def test_prometheus_down_holds_and_is_unhealthy() -> None:
    err = PrometheusError("PrometheusUnreachable", "http://p:9090: ConnectError")
    res = evaluate(dd(), RT, err, NOW)
    assert res.desired == {"prefill": 2, "decode": 4}
    assert (res.condition["status"], res.condition["reason"]) == ("False", "PrometheusUnreachable")
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


def test_metrics_exported() -> None:
    reg = CollectorRegistry()
    m = AutoscalerMetrics(reg)
    res = evaluate(dd(), RT, BUSY, NOW)
    m.record("ns", "llama", res.decision, {"prefill": 2, "decode": 4}, {"prefill": 2, "decode": 4})
    labels = {"namespace": "ns", "deployment": "llama", "role": "prefill"}
    assert reg.get_sample_value("xpyd_autoscaler_desired_replicas", labels) == 6
    assert reg.get_sample_value("xpyd_autoscaler_decision_reason", {**labels, "reason": "scale-up"}) == 1
    assert reg.get_sample_value("xpyd_autoscaler_scale_events_total", {**labels, "direction": "up"}) == 1
    assert reg.get_sample_value("xpyd_autoscaler_healthy", {"namespace": "ns", "deployment": "llama"}) == 1
