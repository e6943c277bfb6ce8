"""Pure translation between the typed DisaggregatedDeployment and the policy: inputs in, status out.

The operator's autoscaler and `xpyd simulate` both go through here, so every field of
`spec.autoscaling` and of each pool's `autoscaling` reaches the policy the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from xpyd_api import conditions as C
from xpyd_api import labels
from xpyd_api.models import Condition, DisaggregatedDeploymentSpec, DisaggregatedDeploymentStatus
from xpyd_operator import lockstep

from .policy import XpydPolicy
from .slo import SloPolicy
from .slomodel import replica_perfs
from .types import (
    Behavior,
    Decision,
    Policy,
    PolicyInputs,
    PoolBounds,
    PoolDecision,
    PoolMetrics,
    PoolObservation,
    PoolState,
    PrometheusError,
    Targets,
    state_from_dict,
    state_to_dict,
)


@dataclass(frozen=True)
class PoolRuntime:
    """A pool as the API server shows it."""

    replicas: int
    ready: int
    unschedulable: int


@dataclass(frozen=True)
class AutoscaleResult:
    desired: dict[str, int]  # replicas per managed pool
    status: dict[str, Any]  # the value of status.autoscaler
    condition: Condition  # AutoscalerHealthy, its transition time kept while its status holds
    decision: Decision


def pool_runtime(sts: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], role: str) -> PoolRuntime:
    """Size, readiness and GPU-starved replicas of one pool, from its workload and pods.

    `sts` is the pool's StatefulSet or LeaderWorkerSet: replicas and readyReplicas count groups for
    the latter, and a group with any unschedulable pod is one starved replica (never a partial one).
    While an engine change surges a pool (xpyd_operator.lockstep), the pool is its own size: the surge
    replicas (top ordinals: pods of a StatefulSet, groups of a LeaderWorkerSet) count neither in its
    size, nor as ready above it, nor as starved.
    """
    surge = rollout_surge(sts)
    replicas = max(0, int((sts.get("spec") or {}).get("replicas", 1)) - surge)
    ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
    if surge:
        ready = min(ready, replicas)
    starved: set[str] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        pod_labels = meta.get("labels") or {}
        if pod_labels.get(labels.ROLE) != role:
            continue
        if surge and _ordinal(meta) >= replicas:
            continue  # a surge pod: lockstep drops the surge when the scheduler cannot place it
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                group = pod_labels.get(labels.LWS_GROUP_INDEX)
                starved.add(f"group/{group}" if group is not None else f"pod/{meta.get('name')}")
    return PoolRuntime(replicas, ready, len(starved))


def rollout_surge(sts: Mapping[str, Any]) -> int:
    """The surge replicas an engine change's lockstep adds on top of the pool's size (0 when none or garbled)."""
    note = ((sts.get("metadata") or {}).get("annotations") or {}).get(lockstep.SURGE)
    try:
        return max(0, int(note)) if note is not None else 0
    except (TypeError, ValueError):
        return 0


def _ordinal(meta: Mapping[str, Any]) -> int:
    """A replica's ordinal: a LeaderWorkerSet pod's group index (its name ends in its worker index), else a
    StatefulSet pod's ordinal (its name's last dash-separated part); -1 when it has none."""
    group = str((meta.get("labels") or {}).get(labels.LWS_GROUP_INDEX, ""))
    tail = group or str(meta.get("name", "")).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def managed_pools(spec: DisaggregatedDeploymentSpec) -> dict[str, PoolBounds]:
    """The pools the autoscaler sizes: those with ``autoscaling`` bounds, when it is enabled."""
    if not spec.autoscaling.enabled:
        return {}
    return {
        role: PoolBounds(pool.autoscaling.min_replicas, pool.autoscaling.max_replicas, max(1, pool.gpus_per_replica))
        for role, pool in spec.pools().items()
        if pool.autoscaling is not None
    }


def policy_inputs(
    spec: DisaggregatedDeploymentSpec,
    runtimes: Mapping[str, PoolRuntime],
    metrics: Mapping[str, PoolMetrics] | None,
    free_gpus: int | None = None,
) -> PolicyInputs:
    """What the policy sees; ``metrics`` is None when Prometheus could not answer."""
    scaling = spec.autoscaling
    bounds = {r: b for r, b in managed_pools(spec).items() if r in runtimes}
    pools = {
        role: PoolObservation.of((metrics or {}).get(role, PoolMetrics()), rt.replicas, rt.ready, rt.unschedulable)
        for role, rt in ((r, runtimes[r]) for r in bounds)
    }
    targets = Targets.model_validate(scaling.targets.model_dump())
    perf = replica_perfs(spec) if spec.slo is not None else {}
    return PolicyInputs(pools, bounds, targets, Behavior.of(scaling), scaling.ratio_band, free_gpus, spec.slo, perf)


def policy_for(spec: DisaggregatedDeploymentSpec) -> Policy:
    """The policy a spec asks for: the SLO policy when spec.slo is set, else the threshold policy."""
    return SloPolicy() if spec.slo is not None else XpydPolicy()


def history(status: DisaggregatedDeploymentStatus) -> dict[str, PoolState]:
    """The policy state kept in status.autoscaler.history (empty if absent or garbled)."""
    return state_from_dict((status.autoscaler or {}).get("history"))


def status_patch(
    old: DisaggregatedDeploymentStatus,
    decision: Decision,
    runtimes: Mapping[str, PoolRuntime],
    error: PrometheusError | None,
    now: float,
    generation: int | None,
) -> tuple[dict[str, Any], Condition]:
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
            "lastScaleTime": C.rfc3339(last) if last is not None else None,
        }
        learnt = decision.state.get(role)
        if learnt is not None and learnt.correction is not None:  # the SLO policy: what it has learnt so far
            autoscaler[role]["sloCorrection"] = round(learnt.correction, 3)
            autoscaler[role]["predictedAttainment"] = learnt.predicted
            autoscaler[role]["readySeconds"] = None if learnt.ready_seconds is None else round(learnt.ready_seconds)
    autoscaler["history"] = state_to_dict(decision.state)
    autoscaler["lastEvaluationTime"] = C.rfc3339(now)
    if error is not None:
        ok, reason, message = False, error.reason, f"{error.message}; holding sizes"
    else:
        ok, reason, message = decision.healthy, decision.health_reason, decision.health_message
    fresh = C.make(C.AUTOSCALER_HEALTHY, ok, reason, message[:1000], generation)
    return autoscaler, C.merge(old.conditions, [fresh], C.rfc3339(now), ())[0]


def wake(inputs: PolicyInputs, decision: Decision) -> Decision:
    """Pools left at zero while the router holds requests for them start one replica (every pool: a request
    needs them all); any policy's answer passes through here. A pool with replicas left is the policy's."""
    pools = dict(decision.pools)
    for role, dec in decision.pools.items():
        obs, bounds = inputs.pools[role], inputs.bounds[role]
        if dec.desired == 0 and (obs.held or 0) > 0 and bounds.max_replicas >= 1:
            message = f"{obs.held:g} requests wait in the router for a worker: starting one replica"
            pools[role] = PoolDecision(1, "wake", message)
    return replace(decision, pools=pools) if pools != decision.pools else decision


def evaluate(
    spec: DisaggregatedDeploymentSpec,
    status: DisaggregatedDeploymentStatus,
    generation: int | None,
    runtimes: Mapping[str, PoolRuntime],
    metrics: Mapping[str, PoolMetrics] | PrometheusError,
    now: float,
    *,
    free_gpus: int | None = None,
    policy: Policy | None = None,
) -> AutoscaleResult:
    """The whole decision for one deployment, without I/O."""
    error = metrics if isinstance(metrics, PrometheusError) else None
    observed = None if isinstance(metrics, PrometheusError) else metrics
    inputs = policy_inputs(spec, runtimes, observed, free_gpus)
    decision = wake(inputs, (policy or policy_for(spec)).decide(inputs, history(status), now))
    auto, cond = status_patch(status, decision, runtimes, error, now, generation)
    return AutoscaleResult({r: d.desired for r, d in decision.pools.items()}, auto, cond, decision)
