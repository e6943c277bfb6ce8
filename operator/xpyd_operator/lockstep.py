"""Engine changes that keep pairable capacity: both pools step through a new engine revision together.

A prefill worker hands KV only to a decode worker of its engine revision (xpyd_api.handoff), so an
engine change that rolled one pool and then the other would leave, between the two, no pair on either
revision. Here both pools move at once, each step gated on every replica of both pools being ready,
with partitions (replicas with an ordinal at or above the partition run the new template). A pool is a
StatefulSet (a replica is a pod, its partition `updateStrategy.rollingUpdate.partition`) or a
LeaderWorkerSet (a replica is a group of pods, its ordinal the group index, ready when every pod of the
group is; its partition `rolloutStrategy.rollingUpdateConfiguration.partition`); the steps are the same:

1. start: the new template with `partition` = the pool's replicas, plus `spec.rollout.maxSurge`
   new-revision replicas on top: each pool gets new capacity before any old replica goes;
2. step: once every replica is ready, each pool's partition drops by one: one old replica per pool is replaced;
3. finish: partition 0 and every replica on the new revision and ready: the surge replicas go.

Surge replicas the scheduler cannot place (no free GPUs) are dropped for the rest of the roll, which goes
on in place: a pending replica at the top ordinal would stop the controller. A new revision whose pods
crash-loop (`FAILED_RESTARTS` restarts) is rolled back: the template it replaced (the StatefulSet's pod
template or the LeaderWorkerSet's leaderWorkerTemplate, kept in an annotation when the roll starts) is
applied again, every replica returns to it, and the failed revision is remembered, so it is not tried
again until the spec asks for another one. Pure: the reconciler passes what it observed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from xpyd_api import labels as L
from xpyd_operator import groups

FAILED_RESTARTS: Final = 3  # restarts of one new-revision pod that fail the revision
PREVIOUS: Final = "xpyd.io/rollback-template"  # workload annotation: the template the roll replaces
PREVIOUS_REV: Final = "xpyd.io/rollback-rev"  # ... its engine revision
SURGE: Final = "xpyd.io/rollout-surge"  # ... the surge replicas in effect for this roll
FAILED: Final = "xpyd.io/failed-rev"  # an engine revision rolled back: not tried again while the spec asks it
NOTES: Final = (PREVIOUS, PREVIOUS_REV, SURGE)


@dataclass(frozen=True, slots=True)
class PodView:
    """One replica: a StatefulSet's pod, or a LeaderWorkerSet's group of pods."""

    ordinal: int  # the pod's ordinal, or the group's index
    rev: str  # the engine revision label (a group's: its leader's)
    ready: bool  # a group: every one of its pods, all on one revision
    unschedulable: bool = False  # PodScheduled=False, reason Unschedulable (a group: any of its pods)
    restarts: int = 0  # the most restarts of one of its containers (a group: of any of its pods)


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool (its StatefulSet or LeaderWorkerSet): the revision the spec asks for and what runs."""

    role: str
    want_rev: str  # the desired template's engine revision
    have_rev: str | None  # the observed workload template's (None: no workload yet)
    replicas: int  # the pool's replicas (the spec's or the autoscaler's; what runs when a scaler owns them)
    partition: int = 0  # the observed workload's partition
    pods: tuple[PodView, ...] = ()  # its replicas
    annotations: Mapping[str, str] = field(default_factory=dict)  # the observed workload's
    template: Mapping[str, Any] | None = None  # the observed workload's (a LeaderWorkerSet: leaderWorkerTemplate)

    def note(self, key: str) -> str | None:
        return self.annotations.get(key)

    def notes(self, *keys: str) -> dict[str, str]:
        """The roll's annotations among `keys` that the workload carries, to carry on."""
        return {k: v for k in keys if (v := self.annotations.get(k)) is not None}


@dataclass(frozen=True, slots=True)
class Step:
    """What to write on one pool's workload besides the desired manifest."""

    replicas: int
    partition: int = 0  # 0: every replica runs the template
    annotations: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] | None = None  # applied instead of the desired template (a rollback)


@dataclass(frozen=True, slots=True)
class Plan:
    steps: dict[str, Step]  # role -> step; empty: apply the desired manifests as they are
    phase: str = ""  # "" (no engine change), starting, rolling, finishing, rolling-back, rolled-back
    message: str = ""


def capacity(pools: Sequence[PoolView]) -> dict[str, dict[str, int]]:
    """Engine revision -> role -> ready replicas; a revision can pair when each role has one."""
    out: dict[str, dict[str, int]] = {}
    for pool in pools:
        for pod in pool.pods:
            if pod.ready:
                by_role = out.setdefault(pod.rev, {p.role: 0 for p in pools})
                by_role[pool.role] += 1
    return dict(sorted(out.items()))


def pairable(pools: Sequence[PoolView]) -> int:
    """Ready replicas of the scarcer role, summed over revisions: what the router can pair right now."""
    return sum(min(by_role.values()) for by_role in capacity(pools).values())


def plan(pools: Sequence[PoolView], max_surge: int, rollback: bool = True, owns_replicas: bool = True) -> Plan:
    """The next step of an engine change across `pools` (one deployment's prefill and decode pools).

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
    """The new template on every pool, old replicas kept below the partition, new surge replicas above it."""
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
        msg += "; surge replicas could not be scheduled (no free GPUs): rolling in place"
    return Plan(steps, "rolling", msg)


def _settled(pool: PoolView, surge: int) -> bool:
    """Every replica present and ready, and those at or above the partition on the new revision."""
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
    """The desired workload manifest with the step's replicas, partition, annotations and template."""
    spec = dict(manifest["spec"])
    if owns_replicas:
        spec["replicas"] = step.replicas
    if manifest.get("kind") == groups.KIND:
        spec["rolloutStrategy"] = groups.rollout_strategy(step.partition)
        if step.template is not None:
            spec["leaderWorkerTemplate"] = dict(step.template)
    else:
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
    """A pool as `plan` sees it, from its desired and observed workloads (StatefulSet or LeaderWorkerSet) and pods."""
    want_rev = _labels(groups.api_template(dict(desired))).get(L.ENGINE_REV, "")
    wanted = desired["spec"].get("replicas")
    if observed is None:
        return PoolView(role, want_rev, None, int(wanted or 0))
    spec = observed.get("spec") or {}
    notes = ((observed.get("metadata") or {}).get("annotations")) or {}
    replicas = wanted if wanted is not None else (spec.get("replicas") or 0)
    if observed.get("kind") == groups.KIND:
        config = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
        template = spec.get("leaderWorkerTemplate")
        size = int((template or {}).get("size") or 1)
        views = _group_views(pods, size)
    else:
        config = (spec.get("updateStrategy") or {}).get("rollingUpdate") or {}
        template = spec.get("template")
        views = tuple(_pod_view(p) for p in pods)
    return PoolView(
        role,
        want_rev,
        _labels(groups.api_template(dict(observed))).get(L.ENGINE_REV, ""),
        int(replicas),
        int(config.get("partition") or 0),
        tuple(sorted(views, key=lambda v: v.ordinal)),
        {str(k): str(v) for k, v in notes.items()},
        template,
    )


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _pod_view(pod: Mapping[str, Any], ordinal: int | None = None) -> PodView:
    meta = pod.get("metadata") or {}
    tail = str(meta.get("name", "")).rsplit("-", 1)[-1]
    status = pod.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conds.get("Ready") or {}).get("status") == "True" and meta.get("deletionTimestamp") is None
    scheduled = conds.get("PodScheduled") or {}
    unschedulable = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    restarts = max((int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []), default=0)
    rev = str((meta.get("labels") or {}).get(L.ENGINE_REV, ""))
    if ordinal is None:
        ordinal = int(tail) if tail.isdigit() else -1
    return PodView(ordinal, rev, ready, unschedulable, restarts)


def _group_views(pods: Sequence[Mapping[str, Any]], size: int) -> tuple[PodView, ...]:
    """One view per LeaderWorkerSet group (its group-index label): its leader's revision, ready when all
    `size` pods are there, ready and on that revision, unschedulable when one is, its pods' most restarts.

    The controller recreates a group at its pods' first restart (RecreateGroupOnPodRestart), which resets
    the counts: a crash-looping group seldom shows FAILED_RESTARTS, and its roll holds rather than rolls back.
    """
    members: dict[int, list[tuple[int, PodView]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        index, rank = str(labels.get(L.LWS_GROUP_INDEX, "")), str(labels.get(L.LWS_WORKER_INDEX, "0"))
        if index.isdigit():
            members.setdefault(int(index), []).append((int(rank) if rank.isdigit() else 0, _pod_view(pod, int(index))))
    out = []
    for group, ranked in members.items():
        views = [v for _, v in sorted(ranked, key=lambda rv: rv[0])]  # the leader (rank 0) first
        rev = views[0].rev
        ready = len(views) >= size and all(v.ready and v.rev == rev for v in views)
        unschedulable = any(v.unschedulable for v in views)
        out.append(PodView(group, rev, ready, unschedulable, max(v.restarts for v in views)))
    return tuple(out)
