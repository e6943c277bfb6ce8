"""Engine changes in lockstep: both pools (StatefulSets or LeaderWorkerSets) step through a new revision, pairs kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_api import labels as L
from xpyd_operator import lockstep
from xpyd_operator.autoscaling.spec import pool_runtime
from xpyd_operator.lockstep import FAILED, PREVIOUS, PREVIOUS_REV, SURGE, PodView, PoolView, Step

OLD_TEMPLATE = {"metadata": {"labels": {"xpyd.io/engine-rev": "v1"}}, "spec": {"containers": [{"name": "engine"}]}}


def pods(*revs: str, ready: bool = True) -> tuple[PodView, ...]:
    return tuple(PodView(i, rev, ready) for i, rev in enumerate(revs))


def notes(surge: int = 1, failed: str | None = None) -> dict[str, str]:
    out = {PREVIOUS: json.dumps(OLD_TEMPLATE), PREVIOUS_REV: "v1", SURGE: str(surge)}
    return {**out, FAILED: failed} if failed else out


def view(role: str, have: str | None, n: int, partition: int = 0, running: tuple[PodView, ...] = (),
         annotations: dict[str, str] | None = None, want: str = "v2") -> PoolView:  # fmt: skip
    return PoolView(role, want, have, n, partition, running, annotations or {}, OLD_TEMPLATE)


def test_no_engine_change_writes_nothing_extra() -> None:
    pools = [
        view("prefill", "v2", 2, running=pods("v2", "v2")),
        view("decode", "v2", 3, running=pods("v2", "v2", "v2")),
    ]
    assert lockstep.plan(pools, max_surge=1).steps == {}


def test_a_new_deployment_or_a_single_pool_has_nothing_to_keep() -> None:
    assert lockstep.plan([view("prefill", None, 2), view("decode", None, 2)], 1).steps == {}
    assert lockstep.plan([view("decode", "v1", 2, running=pods("v1", "v1"))], 1).steps == {}


def test_start_surges_both_pools_and_keeps_every_old_pod() -> None:
    pools = [
        view("prefill", "v1", 2, running=pods("v1", "v1")),
        view("decode", "v1", 3, running=pods("v1", "v1", "v1")),
    ]
    plan = lockstep.plan(pools, max_surge=1)
    assert plan.phase == "starting"
    prefill, decode = plan.steps["prefill"], plan.steps["decode"]
    assert (prefill.replicas, prefill.partition, decode.replicas, decode.partition) == (3, 2, 4, 3)
    assert json.loads(prefill.annotations[PREVIOUS]) == OLD_TEMPLATE
    assert prefill.annotations[PREVIOUS_REV] == "v1" and prefill.annotations[SURGE] == "1"


@pytest.mark.parametrize(("surge", "owns", "want"), [(0, True, 0), (2, True, 2), (2, False, 0)])
def test_the_surge_is_the_spec_s_unless_a_scaler_owns_the_replicas(surge: int, owns: bool, want: int) -> None:
    pools = [view("prefill", "v1", 1, running=pods("v1")), view("decode", "v1", 2, running=pods("v1", "v1"))]
    plan = lockstep.plan(pools, max_surge=surge, owns_replicas=owns)
    assert plan.steps["decode"] == Step(2 + want, 2, plan.steps["decode"].annotations)
    assert plan.steps["decode"].annotations[SURGE] == str(want)


def rolling(p_part: int, d_part: int, p_pods: tuple[PodView, ...], d_pods: tuple[PodView, ...],
            surge: int = 1) -> list[PoolView]:  # fmt: skip
    return [
        view("prefill", "v2", 2, p_part, p_pods, notes(surge)),
        view("decode", "v2", 3, d_part, d_pods, notes(surge)),
    ]


@pytest.mark.parametrize(
    ("pools", "partitions", "phase"),
    [
        # the surge pods are up and ready: one old pod per pool goes
        (rolling(2, 3, pods("v1", "v1", "v2"), pods("v1", "v1", "v1", "v2")), (1, 2), "rolling"),
        # a surge pod is not ready yet: wait
        (rolling(2, 3, pods("v1", "v1", "v2"), (*pods("v1", "v1", "v1"), PodView(3, "v2", False))), (2, 3), "rolling"),
        # the surge pod is not there yet: wait
        (rolling(2, 3, pods("v1", "v1", "v2"), pods("v1", "v1", "v1")), (2, 3), "rolling"),
        # the controller has not replaced the pod at the partition yet: wait (no second step on a stale view)
        (rolling(1, 2, pods("v1", "v1", "v2"), pods("v1", "v1", "v2", "v2")), (1, 2), "rolling"),
        # prefill is through; decode goes on, prefill stays at 0
        (rolling(0, 1, pods("v2", "v2", "v2"), pods("v1", "v2", "v2", "v2")), (0, 0), "rolling"),
    ],
)
def test_each_step_waits_for_every_pod_of_both_pools(
    pools: list[PoolView], partitions: tuple[int, int], phase: str
) -> None:
    plan = lockstep.plan(pools, max_surge=1)
    assert plan.phase == phase
    assert (plan.steps["prefill"].partition, plan.steps["decode"].partition) == partitions
    assert (plan.steps["prefill"].replicas, plan.steps["decode"].replicas) == (3, 4)
    assert plan.steps["decode"].annotations[PREVIOUS_REV] == "v1"


def test_finishing_releases_the_surge_and_the_notes() -> None:
    plan = lockstep.plan(rolling(0, 0, pods("v2", "v2", "v2"), pods("v2", "v2", "v2", "v2")), max_surge=1)
    assert plan.phase == "finishing"
    assert plan.steps == {"prefill": Step(2), "decode": Step(3)}


def test_surge_pods_without_gpus_are_dropped_and_the_roll_goes_on_in_place() -> None:
    stuck = PodView(3, "v2", False, unschedulable=True)
    plan = lockstep.plan(rolling(2, 3, pods("v1", "v1", "v2"), (*pods("v1", "v1", "v1"), stuck)), max_surge=1)
    assert (plan.steps["prefill"].replicas, plan.steps["decode"].replicas) == (2, 3)
    assert plan.steps["decode"].annotations[SURGE] == "0"
    assert "no free GPUs" in plan.message
    # next pass: the surge is gone (3 decode pods), both pools step in place
    again = lockstep.plan(rolling(2, 3, pods("v1", "v1"), pods("v1", "v1", "v1"), surge=0), max_surge=1)
    assert (again.steps["prefill"].partition, again.steps["decode"].partition) == (1, 2)
    assert (again.steps["prefill"].replicas, again.steps["decode"].replicas) == (2, 3)


def test_a_crash_looping_revision_is_rolled_back_and_not_tried_again() -> None:
    bad = PodView(3, "v2", False, restarts=lockstep.FAILED_RESTARTS)
    plan = lockstep.plan(rolling(2, 3, pods("v1", "v1", "v2"), (*pods("v1", "v1", "v1"), bad)), max_surge=1)
    assert plan.phase == "rolling-back"
    for role, n in (("prefill", 2), ("decode", 3)):
        step = plan.steps[role]
        assert (step.replicas, step.partition, step.template) == (n, 0, OLD_TEMPLATE)
        assert step.annotations[FAILED] == "v2"
    assert "rolling back" in plan.message and "v1" in plan.message
    # rolled back: the failed revision stays off while the spec asks for it
    back = [
        view("prefill", "v1", 2, 0, pods("v1", "v1"), notes(failed="v2")),
        view("decode", "v1", 3, 0, pods("v1", "v1", "v1"), notes(failed="v2")),
    ]
    stay = lockstep.plan(back, max_surge=1)
    assert stay.phase == "rolled-back" and stay.steps["decode"].template == OLD_TEMPLATE
    # the spec asks for another revision: a new roll starts from what runs
    fixed = [
        view("prefill", "v1", 2, 0, pods("v1", "v1"), {FAILED: "v2"}, want="v3"),
        view("decode", "v1", 3, 0, pods("v1", "v1", "v1"), {FAILED: "v2"}, want="v3"),
    ]
    fresh = lockstep.plan(fixed, max_surge=1)
    assert fresh.phase == "starting" and FAILED not in fresh.steps["decode"].annotations


def test_no_rollback_when_it_is_off() -> None:
    bad = PodView(3, "v2", False, restarts=lockstep.FAILED_RESTARTS)
    plan = lockstep.plan(rolling(2, 3, pods("v1", "v1", "v2"), (*pods("v1", "v1", "v1"), bad)), 1, rollback=False)
    assert plan.phase == "rolling"


def test_capacity_and_pairable_count_ready_pods_per_revision() -> None:
    pools = rolling(1, 2, pods("v1", "v2", "v2"), (*pods("v1", "v1", "v2"), PodView(3, "v2", False)))
    assert lockstep.capacity(pools) == {"v1": {"prefill": 1, "decode": 2}, "v2": {"prefill": 2, "decode": 1}}
    assert lockstep.pairable(pools) == 2
    assert lockstep.pairable(rolling(0, 0, pods("v2"), pods("v1"))) == 0  # no revision has both roles


def test_apply_writes_replicas_partition_notes_and_a_rollback_template() -> None:
    manifest: dict[str, Any] = {
        "kind": "StatefulSet",
        "metadata": {"name": "x", "annotations": {"keep": "1"}},
        "spec": {"replicas": 2, "template": {"new": True}, "updateStrategy": {"type": "RollingUpdate"}},
    }
    out = lockstep.apply(manifest, Step(3, 2, {SURGE: "1"}), owns_replicas=True)
    assert out["spec"]["replicas"] == 3
    assert out["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}
    assert out["metadata"]["annotations"] == {"keep": "1", SURGE: "1"}
    assert manifest["spec"]["replicas"] == 2  # the input is left as it was
    back = lockstep.apply(manifest, Step(2, 0, {}, OLD_TEMPLATE), owns_replicas=False)
    assert back["spec"]["template"] == OLD_TEMPLATE and back["spec"]["updateStrategy"] == {"type": "RollingUpdate"}


def test_pool_view_reads_pods_partition_and_notes() -> None:
    desired = {"spec": {"replicas": 2, "template": {"metadata": {"labels": {"xpyd.io/engine-rev": "v2"}}}}}
    observed = {
        "metadata": {"annotations": {SURGE: "1"}},
        "spec": {"replicas": 3, "updateStrategy": {"rollingUpdate": {"partition": 2}}, "template": OLD_TEMPLATE},
    }
    pod = {
        "metadata": {"name": "llama-decode-2", "labels": {"xpyd.io/engine-rev": "v2"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "False",
                                                                   "reason": "Unschedulable"}],
            "containerStatuses": [{"restartCount": 4}],
        },
    }  # fmt: skip
    got = lockstep.pool_view("decode", desired, observed, [pod])
    assert (got.want_rev, got.have_rev, got.replicas, got.partition) == ("v2", "v1", 2, 2)
    assert got.pods == (PodView(2, "v2", False, True, 4),)
    assert got.note(SURGE) == "1" and got.template == OLD_TEMPLATE
    assert lockstep.pool_view("decode", desired, None, []).have_rev is None


STUCK = PodView(3, "v2", False, unschedulable=True)


@pytest.mark.parametrize(
    ("pools", "surge", "phase"),
    [
        ([view("prefill", "v1", 2, running=pods("v1", "v1")), view("decode", "v1", 3, running=pods("v1", "v1", "v1"))],
         2, "starting"),
        (rolling(2, 3, pods("v1", "v1", "v2"), pods("v1", "v1", "v1", "v2")), 1, "rolling"),
        (rolling(2, 3, pods("v1", "v1", "v2"), (*pods("v1", "v1", "v1"), STUCK)), 1, "rolling"),  # surge dropped
        (rolling(0, 0, pods("v2", "v2", "v2"), pods("v2", "v2", "v2", "v2")), 1, "finishing"),
        ([view("prefill", "v2", 2, 1, (*pods("v1"), PodView(1, "v2", False, restarts=3)), notes()),
          view("decode", "v2", 3, 2, pods("v1", "v1", "v2", "v2"), notes())], 1, "rolling-back"),
    ],
)  # fmt: skip
def test_the_autoscaler_reads_each_pool_s_own_size_at_every_phase(pools: list[PoolView], surge: int,
                                                                  phase: str) -> None:  # fmt: skip
    """What the lockstep writes on a StatefulSet, read back as the autoscaler reads it: the pool's size, never
    its size plus the surge (which the autoscaler would take for a resize and keep)."""
    plan = lockstep.plan(pools, max_surge=surge)
    assert plan.phase == phase
    for pool in pools:
        manifest = {"metadata": {"name": f"dd-{pool.role}"}, "spec": {"replicas": pool.replicas}}
        written = lockstep.apply(manifest, plan.steps[pool.role], owns_replicas=True)
        assert pool_runtime(written, [], pool.role).replicas == pool.replicas


LWT = {"size": 2, "leaderTemplate": OLD_TEMPLATE, "workerTemplate": OLD_TEMPLATE}


def group_pod(group: int, rank: int, rev: str = "v1", ready: bool = True, restarts: int = 0,
              unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    """A LeaderWorkerSet pod: its name ends in its worker index (the leader's in its group index)."""
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    labels = {"xpyd.io/role": "decode", "xpyd.io/engine-rev": rev}
    labels |= {L.LWS_GROUP_INDEX: str(group), L.LWS_WORKER_INDEX: str(rank)}
    status = {"conditions": conditions, "containerStatuses": [{"restartCount": restarts}]}
    status["phase"] = "Pending" if unschedulable else "Running"
    name = f"dd-decode-{group}-{rank}" if rank else f"dd-decode-{group}"
    return {"metadata": {"name": name, "labels": labels}, "status": status}


@pytest.mark.parametrize(
    ("members", "want"),
    [
        ([group_pod(0, 0), group_pod(0, 1)], PodView(0, "v1", True)),  # every pod of the group ready
        ([group_pod(1, 0), group_pod(1, 1, ready=False)], PodView(1, "v1", False)),  # one rank not ready
        ([group_pod(2, 0)], PodView(2, "v1", False)),  # a rank missing (the group is being made)
        ([group_pod(3, 1, "v1"), group_pod(3, 0, "v2")], PodView(3, "v2", False)),  # ranks on two revisions
        ([group_pod(4, 0, "v2"), group_pod(4, 1, "v2", ready=False, unschedulable=True)],
         PodView(4, "v2", False, unschedulable=True)),  # one rank without GPUs: the group is unplaced
        ([group_pod(5, 0, "v2", ready=False), group_pod(5, 1, "v2", ready=False, restarts=4)],
         PodView(5, "v2", False, restarts=4)),  # the most restarts of any of its pods
    ],
)  # fmt: skip
def test_a_leaderworkerset_replica_is_one_group_of_pods(members: list[dict[str, Any]], want: PodView) -> None:
    desired = {"kind": "LeaderWorkerSet", "spec": {"replicas": 3, "leaderWorkerTemplate": {
        "leaderTemplate": {"metadata": {"labels": {"xpyd.io/engine-rev": "v2"}}}}}}  # fmt: skip
    observed = {
        "kind": "LeaderWorkerSet",
        "metadata": {"annotations": {SURGE: "1"}},
        "spec": {"replicas": 4, "leaderWorkerTemplate": LWT,
                 "rolloutStrategy": {"rollingUpdateConfiguration": {"partition": 2, "maxSurge": 0}}},
    }  # fmt: skip
    got = lockstep.pool_view("decode", desired, observed, members)
    assert (got.want_rev, got.have_rev, got.replicas, got.partition) == ("v2", "v1", 3, 2)
    assert got.template == LWT and got.note(SURGE) == "1"
    assert got.pods == (want,)


def test_apply_on_a_leaderworkerset_writes_groups_partition_and_its_leaderworkertemplate() -> None:
    manifest: dict[str, Any] = {
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "dd-decode", "annotations": {"keep": "1"}},
        "spec": {"replicas": 3, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": {"new": True}},
                 "rolloutStrategy": {"type": "RollingUpdate"}},
    }  # fmt: skip
    out = lockstep.apply(manifest, Step(4, 3, {SURGE: "1"}), owns_replicas=True)
    assert out["spec"]["replicas"] == 4  # groups: the pool's three and one surge group
    assert out["spec"]["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"partition": 3, "maxSurge": 0, "maxUnavailable": 1},
    }  # the controller's own surge stays 0: the partition drives the roll
    assert "updateStrategy" not in out["spec"] and "template" not in out["spec"]
    assert out["metadata"]["annotations"] == {"keep": "1", SURGE: "1"}
    back = lockstep.apply(manifest, Step(3, 0, {}, LWT), owns_replicas=False)
    assert back["spec"]["leaderWorkerTemplate"] == LWT and back["spec"]["replicas"] == 3
    assert back["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] == 0


def test_the_autoscaler_reads_a_surged_leaderworkerset_as_its_own_groups() -> None:
    """During a roll the LeaderWorkerSet runs 3 + 1 surge groups; a group's pods end in their worker index,
    so the surge group is found by its group index, not by a pod name's tail."""
    lws = {"kind": "LeaderWorkerSet", "metadata": {"annotations": {SURGE: "1"}}, "spec": {"replicas": 4},
           "status": {"readyReplicas": 4}}  # fmt: skip
    running = [group_pod(3, 0, "v2", ready=False, unschedulable=True), group_pod(3, 1, "v2", ready=False,
               unschedulable=True), group_pod(1, 5, ready=False, unschedulable=True)]  # fmt: skip
    got = pool_runtime(lws, running, "decode")
    assert (got.replicas, got.ready, got.unschedulable) == (3, 3, 1)  # group 1 starved; the surge group not counted
