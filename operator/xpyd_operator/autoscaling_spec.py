"""Pure translation between a DisaggregatedDeployment (as a dict) and the policy's inputs and status."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from xpyd_api import labels

from .autoscaling_prometheus import PoolMetrics, PrometheusError
from .autoscaling_types import (
    Behavior,
    Decision,
    PolicyInputs,
    PoolBounds,
    PoolObservation,
    Targets,
    state_from_dict,
    state_to_dict,
)

CONDITION = "AutoscalerHealthy"
ROLES = ("prefill", "decode", "worker")
# Optional spec.autoscaling.targets keys (camelCase) -> Targets fields.
TARGET_KEYS = {
    "prefillWaitingPerReplica": "prefill_waiting_per_replica",
    "prefillRunningPerReplica": "prefill_running_per_replica",
    "prefillTokensPerSecondPerReplica": "prefill_tokens_per_second_per_replica",
    "prefillUtilization": "prefill_utilization",
    "decodeKvUsage": "decode_kv_usage",
    "decodeWaitingPerReplica": "decode_waiting_per_replica",
    "decodeRunningPerReplica": "decode_running_per_replica",
    "ttftP90Seconds": "ttft_p90_seconds",
    "itlP90Seconds": "itl_p90_seconds",
}


@dataclass(frozen=True)
class PoolRuntime:
    """A pool as the API server shows it."""

    replicas: int
    ready: int
    unschedulable: int


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def pool_runtime(sts: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], role: str) -> PoolRuntime:
    """Size, readiness and GPU-starved Pending pods of one pool, from its StatefulSet and pods."""
    replicas = int((sts.get("spec") or {}).get("replicas", 1))
    ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
    starved = 0
    for pod in pods:
        if (pod.get("metadata", {}).get("labels") or {}).get(labels.ROLE) != role:
            continue
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                starved += 1
    return PoolRuntime(replicas, ready, starved)


def managed_pools(spec: Mapping[str, Any]) -> dict[str, PoolBounds]:
    """The pools the autoscaler sizes: those with ``autoscaling`` bounds, when it is enabled."""
    if not (spec.get("autoscaling") or {}).get("enabled"):
        return {}
    out = {}
    for role in ROLES:
        pool = spec.get(role) or {}
        scaling = pool.get("autoscaling")
        if scaling:
            out[role] = PoolBounds(
                int(scaling.get("minReplicas", 1)),
                int(scaling["maxReplicas"]),
                max(1, int(pool.get("gpusPerReplica", 1))),
            )
    return out


def policy_inputs(
    spec: Mapping[str, Any],
    runtimes: Mapping[str, PoolRuntime],
    metrics: Mapping[str, PoolMetrics] | None,
    free_gpus: int | None = None,
) -> PolicyInputs:
    """What the policy sees; ``metrics`` is None when Prometheus could not answer."""
    scaling = spec.get("autoscaling") or {}
    bounds = {r: b for r, b in managed_pools(spec).items() if r in runtimes}
    pools = {}
    for role in bounds:
        rt = runtimes[role]
        m = (metrics or {}).get(role, PoolMetrics())
        values = {f.name: getattr(m, f.name) for f in fields(PoolMetrics)}
        pools[role] = PoolObservation(rt.replicas, rt.ready, rt.unschedulable, **values)
    raw_targets = scaling.get("targets") or {}
    unknown = set(raw_targets) - set(TARGET_KEYS)
    if unknown:
        raise ValueError(f"unknown spec.autoscaling.targets keys {sorted(unknown)}; known: {sorted(TARGET_KEYS)}")
    targets = Targets(**{TARGET_KEYS[k]: v for k, v in raw_targets.items()})
    interval = float(scaling.get("intervalSeconds", 15))
    behavior = Behavior(
        stabilization_seconds=float(scaling.get("stabilizationSeconds", 300)),
        stale_after_seconds=float(scaling.get("staleAfterSeconds", max(60.0, 4 * interval))),
    )
    band = scaling.get("ratioBand")
    ratio = (float(band["min"]), float(band["max"])) if band else None
    return PolicyInputs(pools, bounds, targets, behavior, ratio, free_gpus)


def status_patch(
    old_status: Mapping[str, Any],
    decision: Decision,
    runtimes: Mapping[str, PoolRuntime],
    error: PrometheusError | None,
    now: float,
    generation: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``status.autoscaler`` and the AutoscalerHealthy condition for this decision."""
    autoscaler: dict[str, Any] = {}
    for role, d in decision.pools.items():
        last = decision.state[role].last_scale_time if role in decision.state else None
        autoscaler[role] = {
            "desired": d.desired,
            "actual": runtimes[role].ready,
            "replicas": runtimes[role].replicas,
            "reason": d.reason,
            "message": d.message[:500],
            "lastScaleTime": rfc3339(last) if last is not None else None,
        }
    autoscaler["history"] = state_to_dict(decision.state)
    autoscaler["lastEvaluationTime"] = rfc3339(now)
    if error is not None:
        ok, reason, message = False, error.reason, f"{error.message}; holding sizes"
    else:
        ok, reason, message = decision.healthy, decision.health_reason, decision.health_message
    status = "True" if ok else "False"
    previous = next((c for c in old_status.get("conditions") or [] if c.get("type") == CONDITION), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": since or rfc3339(now),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return autoscaler, condition


def history(status: Mapping[str, Any]) -> dict[str, Any]:
    """The policy state kept in status.autoscaler.history (empty if absent or garbled)."""
    return state_from_dict((status.get("autoscaler") or {}).get("history"))
