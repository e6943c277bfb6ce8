"""Engine changes that keep pairable capacity: both pools step through a new engine revision together.

A prefill worker hands KV only to a decode worker of its engine revision (xpyd_api.handoff), so an
engine change that rolled one pool and then the other would leave, between the two, no pair on either
revision. Here both StatefulSet pools move at once, each step gated on every pod of both pools being
ready, with StatefulSet partitions (pods with an ordinal at or above the partition run the new template):

1. start: the new template with `partition` = the pool's replicas, plus `spec.rollout.maxSurge`
   new-revision replicas on top: each pool gets new capacity before any old pod goes;
2. step: once every pod is ready, each pool's partition drops by one: one old pod per pool is replaced;
3. finish: partition 0 and every pod on the new revision and ready: the surge replicas go.

Surge pods the scheduler cannot place (no free GPUs) are dropped for the rest of the roll, which goes
on in place: a pending pod at the top ordinal would stop the StatefulSet controller. A new revision
whose pods crash-loop (`FAILED_RESTARTS` restarts) is rolled back: the template it replaced (kept in an
annotation when the roll starts) is applied again, every pod returns to it, and the failed revision is
remembered, so it is not tried again until the spec asks for another one. LeaderWorkerSet pools keep
decode-first ordering (xpyd_operator.rollout). Pure: the reconciler passes what it observed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from xpyd_api import labels as L

FAILED_RESTARTS: Final = 3  # restarts of one new-revision pod that fail the revision
PREVIOUS: Final = "xpyd.io/rollback-template"  # StatefulSet annotation: the pod template the roll replaces
PREVIOUS_REV: Final = "xpyd.io/rollback-rev"  # ... its engine revision
SURGE: Final = "xpyd.io/rollout-surge"  # ... the surge replicas in effect for this roll
FAILED: Final = "xpyd.io/failed-rev"  # an engine revision rolled back: not tried again while the spec asks it
NOTES: Final = (PREVIOUS, PREVIOUS_REV, SURGE)


@dataclass(frozen=True, slots=True)
class PodView:
    ordinal: int
    rev: str  # the pod's engine revision label
    ready: bool
    unschedulable: bool = False  # PodScheduled=False, reason Unschedulable
    restarts: int = 0  # the most restarts of one of its containers


@dataclass(frozen=True, slots=True)
class PoolView:
    """One StatefulSet pool: the revision the spec asks for and what runs."""

    role: str
    want_rev: str  # the desired template's engine revision
    have_rev: str | None  # the observed StatefulSet template's (None: no StatefulSet yet)
    replicas: int  # the pool's replicas (the spec's or the autoscaler's; what runs when a scaler owns them)
    partition: int = 0  # the observed StatefulSet's partition
    pods: tuple[PodView, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)  # the observed StatefulSet's
    template: Mapping[str, Any] | None = None  # the observed StatefulSet's pod template

    def note(self, key: str) -> str | None:
        return self.annotations.get(key)

    def notes(self, *keys: str) -> dict[str, str]:
        """The roll's annotations among `keys` that the StatefulSet carries, to carry on."""
        return {k: v for k in keys if (v := self.annotations.get(k)) is not None}


@dataclass(frozen=True, slots=True)
class Step:
    """What to write on one pool's StatefulSet besides the desired manifest."""

    replicas: int
    partition: int = 0  # 0: every pod runs the template
    annotations: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] | None = None  # applied instead of the desired template (a rollback)


@dataclass(frozen=True, slots=True)
class Plan:
    steps: dict[str, Step]  # role -> step; empty: apply the desired manifests as they are
    phase: str = ""  # "" (no engine change), starting, rolling, finishing, rolling-back, rolled-back
    message: str = ""


def capacity(pools: Sequence[PoolView]) -> dict[str, dict[str, int]]:
    """Engine revision -> role -> ready pods; a revision can pair when each role has one."""
    out: dict[str, dict[str, int]] = {}
    for pool in pools:
        for pod in pool.pods:
            if pod.ready:
                by_role = out.setdefault(pod.rev, {p.role: 0 for p in pools})
                by_role[pool.role] += 1
    return dict(sorted(out.items()))


def pairable(pools: Sequence[PoolView]) -> int:
    """Ready pods of the scarcer role, summed over revisions: what the router can pair right now."""
    return sum(min(by_role.values()) for by_role in capacity(pools).values())


def plan(pools: Sequence[PoolView], max_surge: int, rollback: bool = True, owns_replicas: bool = True) -> Plan:
    """The next step of an engine change across `pools` (one deployment's StatefulSet pools).

    `owns_replicas`: the operator writes the pools' replicas; when an external scaler does, no surge.
    """
    if len(pools) < 2 or any(p.have_rev is None for p in pools):
        return Plan({})  # a co-located pool or a new deployment: nothing to stay compatible with
    if all(p.note(FAILED) == p.want_rev for p in pools):
        return _rolled_back(pools, "rolled-back")
    under_way = any(p.have_rev != p.want_rev or p.note(PREVIOUS) is not None for p in pools)
    if not under_way:
        return Plan({})
    if rollback and any(p.note(PREVIOUS) for p in pools) and any(_failing(p) for p in pools):
        return _rolled_back(pools, "rolling-back")
    if any(p.have_rev != p.want_rev for p in pools):
        return _start(pools, max_surge if owns_replicas else 0)
    return _step(pools)


def _failing(pool: PoolView) -> bool:
    return any(p.rev == pool.want_rev and p.restarts >= FAILED_RESTARTS for p in pool.pods)


def _start(pools: Sequence[PoolView], surge: int) -> Plan:
    """The new template on every pool, old pods kept below the partition, new surge pods above it."""
    steps = {}
    for p in pools:
        notes = p.notes(*NOTES)  # a second edit mid-roll keeps the first
        if PREVIOUS not in notes and p.template is not None and p.have_rev is not None:
            notes[PREVIOUS] = json.dumps(p.template, sort_keys=True, separators=(",", ":"))
            notes[PREVIOUS_REV] = p.have_rev
        notes[SURGE] = notes.get(SURGE, str(surge))
        steps[p.role] = Step(p.replicas + int(notes[SURGE]), p.replicas, notes)
    msg = f"engine change to revision {pools[0].want_rev}: both pools step together, {surge} surge replica(s) each"
    return Plan(steps, "starting", msg)


def _step(pools: Sequence[PoolView]) -> Plan:
    surge = min(int(p.note(SURGE) or 0) for p in pools)
    unplaced = surge > 0 and any(d.unschedulable and d.ordinal >= p.replicas for p in pools for d in p.pods)
    if unplaced:
        surge = 0  # no free GPUs for the surge: drop it for the rest of this roll
    settled = all(_settled(p, surge) for p in pools)
    if settled and all(p.partition == 0 for p in pools):
        return Plan({p.role: Step(p.replicas) for p in pools}, "finishing", "engine change complete")
    steps = {}
    for p in pools:
        partition = min(p.partition, p.replicas)
        if settled:
            partition = max(0, partition - 1)
        notes = {**p.notes(*NOTES), SURGE: str(surge)}
        steps[p.role] = Step(p.replicas + surge, partition, notes)
    seen = capacity(pools).items()
    by_rev = "; ".join(f"{rev}: " + ", ".join(f"{r} {n}" for r, n in roles.items()) for rev, roles in seen)
    msg = f"engine change to revision {pools[0].want_rev}, both pools in step; ready by revision: {by_rev or 'none'}"
    if unplaced:
        msg += "; surge pods could not be scheduled (no free GPUs): rolling in place"
    return Plan(steps, "rolling", msg)


def _settled(pool: PoolView, surge: int) -> bool:
    """Every pod present and ready, and those at or above the partition on the new revision."""
    if len(pool.pods) != pool.replicas + surge or not all(p.ready for p in pool.pods):
        return False
    return all(p.rev == pool.want_rev for p in pool.pods if p.ordinal >= pool.partition)


def _rolled_back(pools: Sequence[PoolView], phase: str) -> Plan:
    steps = {}
    for p in pools:
        previous = p.note(PREVIOUS)
        notes = {**p.notes(PREVIOUS, PREVIOUS_REV), FAILED: p.want_rev}
        steps[p.role] = Step(p.replicas, 0, notes, json.loads(previous) if previous else None)
    back = ", ".join(sorted({p.note(PREVIOUS_REV) or "the previous revision" for p in pools}))
    if phase == "rolling-back":
        msg = f"engine revision {pools[0].want_rev} failed (a pod restarted {FAILED_RESTARTS} times): rolling back"
    else:
        msg = f"engine revision {pools[0].want_rev} was rolled back; it is not tried again until the spec changes"
    return Plan(steps, phase, f"{msg}; serving {back}")


def apply(manifest: dict[str, Any], step: Step, owns_replicas: bool) -> dict[str, Any]:
    """The desired StatefulSet manifest with the step's replicas, partition, annotations and template."""
    spec = dict(manifest["spec"])
    if owns_replicas:
        spec["replicas"] = step.replicas
    strategy: dict[str, Any] = {"type": "RollingUpdate"}
    if step.partition > 0:
        strategy["rollingUpdate"] = {"partition": step.partition}
    spec["updateStrategy"] = strategy
    if step.template is not None:
        spec["template"] = dict(step.template)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), **step.annotations}
    return {**manifest, "metadata": meta, "spec": spec}


def pool_view(role: str, desired: Mapping[str, Any], observed: Mapping[str, Any] | None,
              pods: Sequence[Mapping[str, Any]]) -> PoolView:  # fmt: skip
    """A pool as `plan` sees it, from its desired and observed StatefulSets and its pods."""
    want_rev = _labels(desired["spec"]["template"]).get(L.ENGINE_REV, "")
    wanted = desired["spec"].get("replicas")
    if observed is None:
        return PoolView(role, want_rev, None, int(wanted or 0))
    spec = observed.get("spec") or {}
    strategy = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
    notes = ((observed.get("metadata") or {}).get("annotations")) or {}
    replicas = wanted if wanted is not None else (spec.get("replicas") or 0)
    return PoolView(
        role,
        want_rev,
        _labels(spec.get("template") or {}).get(L.ENGINE_REV, ""),
        int(replicas),
        int(strategy.get("partition") or 0),
        tuple(sorted((_pod_view(p) for p in pods), key=lambda v: v.ordinal)),
        {str(k): str(v) for k, v in notes.items()},
        spec.get("template"),
    )


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    tail = str(meta.get("name", "")).rsplit("-", 1)[-1]
    status = pod.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conds.get("Ready") or {}).get("status") == "True" and meta.get("deletionTimestamp") is None
    scheduled = conds.get("PodScheduled") or {}
    unschedulable = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    restarts = max((int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []), default=0)
    rev = str((meta.get("labels") or {}).get(L.ENGINE_REV, ""))
    return PodView(int(tail) if tail.isdigit() else -1, rev, ready, unschedulable, restarts)
