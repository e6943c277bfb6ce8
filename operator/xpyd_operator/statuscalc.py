"""Status that tells the truth: pool counts, placement and conditions computed from observed children."""

from __future__ import annotations

from typing import Any

from xpyd_api import conditions as C
from xpyd_api import labels as L
from xpyd_api.models import (
    Condition,
    DisaggregatedDeploymentSpec,
    DisaggregatedDeploymentStatus,
    PoolStatus,
)
from xpyd_operator import groups, rollout, sizing
from xpyd_operator.desired import Desired, Observed
from xpyd_operator.meta import Owner, child_name


def pool_status(observed: Observed, owner: Owner, role: str, kind: str | None = None) -> PoolStatus:
    """Replicas (groups, for a multi-node pool) wanted and ready, from the pool's workload."""
    name = child_name(owner, role)
    obj = (observed.children.get((kind, name)) if kind else groups.by_name(observed.children, name)) or {}
    want = obj.get("spec", {}).get("replicas")
    ready = obj.get("status", {}).get("readyReplicas") or 0
    pods = groups.pods_per_replica(obj) if obj.get("kind") == groups.KIND else None
    return PoolStatus(replicas=int(want if want is not None else 0), ready_replicas=int(ready), pods_per_replica=pods)


def xpyd_label(pools: dict[str, PoolStatus]) -> str:
    if "worker" in pools:
        return f"{pools['worker'].replicas}C"
    return f"{pools['prefill'].replicas}P{pools['decode'].replicas}D"


def layout_label(spec: DisaggregatedDeploymentSpec) -> str:
    """Pods x GPUs of one replica per pool, e.g. 'P 4x8 GPUs, D 2x8 GPUs' (kubectl get dd's Layout column)."""
    short = {"prefill": "P", "decode": "D", "worker": "C"}
    parts = [f"{short[role]} {lay.pods}x{lay.gpus_per_pod} GPUs" for role, lay in spec.layouts().items()]
    return ", ".join(parts)


def _rolling(observed: Observed, owner: Owner, roles: list[str]) -> list[str]:
    """Pools (and the router) whose controller has not caught up with their latest spec."""
    out = []
    named = [(r, groups.find(observed.children, owner, r)) for r in roles]
    for role, obj in [*named, ("router", observed.children.get(("Deployment", child_name(owner, "router"))))]:
        if obj is None or not groups.rolled(obj)[0]:
            out.append(role)
    return out


def worthwhile(spec: DisaggregatedDeploymentSpec, gen: int | None) -> Condition:
    pool = spec.prefill or spec.worker
    try:
        verdict = sizing.break_even_of(spec, pool) if pool is not None else None
    except ValueError as exc:  # unknown model/topology or a replica the model cannot place
        return C.make(C.DISAGGREGATION_WORTHWHILE, "Unknown", "NotModelled", str(exc), gen)
    if verdict is None:
        return C.make(C.DISAGGREGATION_WORTHWHILE, "Unknown", "NoTopology", "topology Any: no hardware to model", gen)
    summary = verdict.summary()
    if spec.mode == "Colocated":
        reason = "ColocatedButWorthwhile" if verdict.disaggregate else "ColocationFits"
    else:
        reason = "TransferBelowStall" if verdict.disaggregate else "TransferAboveStall"
    return C.make(C.DISAGGREGATION_WORTHWHILE, verdict.disaggregate, reason, summary, gen)


def _placement_conditions(
    spec: DisaggregatedDeploymentSpec, desired: Desired, observed: Observed, gen: int | None
) -> list[Condition]:
    pl = desired.placement
    if pl is None:
        return []
    out = [C.make(C.TOPOLOGY_SATISFIED, pl.satisfied, pl.reason, pl.message, gen)]
    topology = spec.topology.hardware
    if topology is not None and topology.compute_domain:
        if not observed.compute_domain_crd:
            msg = "ComputeDomain (resource.nvidia.com/v1beta1) is not installed: no IMEX channel for NVLink"
            out.append(C.make(C.COMPUTE_DOMAIN, False, "ComputeDomainCRDMissing", msg, gen))
        elif not pl.satisfied:
            out.append(C.make(C.COMPUTE_DOMAIN, False, "SpansRacks", "an IMEX channel cannot span racks", gen))
        else:
            msg = f"ComputeDomain for clique {', '.join(pl.cliques)} provides the IMEX channel"
            out.append(C.make(C.COMPUTE_DOMAIN, True, "Created", msg, gen))
    return out


def compute(
    owner: Owner,
    generation: int | None,
    spec: DisaggregatedDeploymentSpec,
    desired: Desired,
    observed: Observed,
    old: list[Condition],
    now: str,
) -> DisaggregatedDeploymentStatus:
    roles = list(spec.pools())
    pools = {role: pool_status(observed, owner, role) for role in roles}
    for role, pool in pools.items():
        pool.images = rollout.serving_revisions(observed.own_pods, role) or None
        pool.revisions = rollout.serving_revisions(observed.own_pods, role, by=L.ENGINE_REV) or None
    router = pool_status(observed, owner, "router", "Deployment")
    nodes = sorted({p.get("spec", {}).get("nodeName") for p in observed.own_pods} - {None, ""})
    conds: list[Condition] = []
    if desired.error is not None:
        reason, message = desired.error
        conds.append(C.make(C.READY, False, reason, f"{message}; running children left untouched", generation))
        conds.append(C.make(C.PROGRESSING, False, "Blocked", "fix the spec to continue", generation))
    else:
        counts = [f"{r} {p.ready_replicas}/{p.replicas}" for r, p in pools.items()]
        counts.append(f"router {router.ready_replicas}/{router.replicas}")
        every = [*pools.values(), router]
        ready = all(p.replicas > 0 and p.ready_replicas >= p.replicas for p in every)
        reason = "AllReplicasReady" if ready else "ReplicasNotReady"
        conds.append(C.make(C.READY, ready, reason, ", ".join(counts) + " ready", generation))
        rolling = _rolling(observed, owner, roles)
        roll = desired.rollout
        if roll is not None and roll.phase in ("rolling-back", "rolled-back"):
            conds.append(C.make(C.PROGRESSING, roll.phase == "rolling-back", "EngineRevisionRolledBack", roll.message,
                                generation))  # fmt: skip
        elif roll is not None and roll.phase:
            conds.append(C.make(C.PROGRESSING, True, "EngineUpgradeInStep", roll.message, generation))
        elif rolling:
            msg = f"rolling out {', '.join(rolling)}"
            conds.append(C.make(C.PROGRESSING, True, "RollingOut", msg, generation))
        elif not ready:
            msg = "children run their latest spec; waiting for replicas to become ready"
            conds.append(C.make(C.PROGRESSING, True, "WaitingForReplicas", msg, generation))
        else:
            conds.append(C.make(C.PROGRESSING, False, "Complete", "every child runs its latest spec", generation))
    conds += _placement_conditions(spec, desired, observed, generation)
    conds.append(worthwhile(spec, generation))
    merged = C.merge(old, conds, now, C.RECONCILER_TYPES)
    placement = None
    if desired.placement is not None:
        pl = desired.placement
        placement = {"cliques": pl.cliques, "nodes": nodes, "kv_path": pl.kv_path}
    return DisaggregatedDeploymentStatus.model_validate(
        {
            "observed_generation": generation,
            "xpyd": xpyd_label(pools),
            "layout": layout_label(spec),
            **pools,
            "router": router,
            "placement": placement,
            "conditions": [c for c in merged if c.type in C.RECONCILER_TYPES],
        }
    )


def owned_view(status: DisaggregatedDeploymentStatus) -> dict[str, Any]:
    """The part of a status the reconciler writes, in a canonical form for comparison and apply."""
    body = status.model_dump(by_alias=True, exclude_none=True, exclude={"autoscaler"})
    conds = [c for c in body.get("conditions", []) if c["type"] in C.RECONCILER_TYPES]
    body["conditions"] = sorted(conds, key=lambda c: c["type"])
    return body
