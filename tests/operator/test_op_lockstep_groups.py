"""Engine changes on LeaderWorkerSet pools, walked through the reconciler: groups step in lockstep too.

A multi-node replica is a LeaderWorkerSet group; the fake API server plays its controller's groups
(made and replaced whole, those at or above the partition on the template's revision). Each walk counts,
at every step, the groups the router could pair on one engine revision.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import (  # type: ignore[import-not-found]
    OWNER,
    FakeKube,
    b200_nodes,
    pairable,
    progressing,
    replicas,
    walk_roll,
)

from xpyd_operator import lockstep
from xpyd_operator.autoscaling.spec import pool_runtime
from xpyd_operator.reconcile import Reconciler

NEW_IMAGE = "vllm/vllm-openai:v0.33.1"


def pool(replicas: int, gpus: int) -> dict[str, Any]:
    """DeepSeek-R1 wide expert parallel: 16 GPUs is a group of two HGX nodes, 8 one StatefulSet pod."""
    return {"replicas": replicas, "gpusPerReplica": gpus, "dataParallelSize": gpus, "expertParallel": True}


def body(prefill_gpus: int, decode_gpus: int, surge: int) -> dict[str, Any]:
    return {
        "model": {"name": "deepseek-ai/DeepSeek-R1"},
        "topology": {"kind": "HGX-B200"},
        "prefill": pool(2, prefill_gpus),
        "decode": pool(3, decode_gpus),
        "rollout": {"maxSurge": surge},
    }


async def _pass(kube: FakeKube) -> list[str]:
    kube.writes.clear()
    await Reconciler(kube).reconcile(OWNER.namespace, OWNER.name)
    return list(kube.writes)


async def _started(spec: dict[str, Any]) -> FakeKube:
    kube = FakeKube(spec, b200_nodes(16))
    kube.lws_crd = True
    kube.simulate_pods = True
    await _pass(kube)
    kube.settle()
    await _pass(kube)
    assert progressing(kube) == "Complete"
    return kube


def _change_engine(kube: FakeKube, image: str = NEW_IMAGE) -> None:
    assert kube.dd is not None
    kube.dd["spec"]["engine"] = {"image": image}
    kube.dd["metadata"]["generation"] = kube.dd["metadata"].get("generation", 1) + 1


def _workload(kube: FakeKube, role: str) -> dict[str, Any]:
    lws: dict[str, Any] | None = kube.objects.get(("LeaderWorkerSet", f"llama-{role}"))
    return lws if lws is not None else dict(kube.objects[("StatefulSet", f"llama-{role}")])


def _sizes(kube: FakeKube) -> tuple[int, int]:
    """The (prefill, decode) replicas the workloads carry: groups of a LeaderWorkerSet, surge included."""
    return _workload(kube, "prefill")["spec"]["replicas"], _workload(kube, "decode")["spec"]["replicas"]


def _own_sizes(kube: FakeKube) -> tuple[int, int]:
    """The (prefill, decode) sizes the autoscaler reads from the workloads: without the surge."""
    prefill, decode = (pool_runtime(_workload(kube, r), [], r).replicas for r in ("prefill", "decode"))
    return prefill, decode


@pytest.mark.parametrize(
    ("prefill_gpus", "decode_gpus", "surge", "least_pairs"),
    [
        (16, 16, 1, 2),  # both pools LeaderWorkerSets, a surge group each
        (16, 16, 0, 1),  # in place: one group per pool at a time
        (16, 8, 1, 2),  # a LeaderWorkerSet prefill beside a StatefulSet decode
        (8, 16, 0, 1),
    ],
)
async def test_an_engine_upgrade_steps_groups_together_and_keeps_pairs(
    prefill_gpus: int, decode_gpus: int, surge: int, least_pairs: int
) -> None:
    kube = await _started(body(prefill_gpus, decode_gpus, surge))
    _change_engine(kube)
    sizes: list[tuple[int, int]] = []
    pairs, reasons = await walk_roll(kube, _pass, lambda k: sizes.append(_own_sizes(k)))
    assert min(pairs) >= least_pairs, pairs  # a revision with a prefill and a decode replica at every step
    assert "EngineUpgradeInStep" in reasons and "EngineUpgradeDecodeFirst" not in reasons
    assert set(sizes) == {(2, 3)}  # the autoscaler reads each pool's own size, never the surge on top
    assert {p["spec"]["containers"][0]["image"] for p in kube.pods.values()} == {NEW_IMAGE}
    for role, n in (("prefill", 2), ("decode", 3)):
        workload = _workload(kube, role)
        assert workload["spec"]["replicas"] == n
        assert not any(k.startswith("xpyd.io/rollback") for k in workload["metadata"]["annotations"])
        if workload["kind"] == "LeaderWorkerSet":
            config = workload["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
            assert config == {"partition": 0, "maxSurge": 0, "maxUnavailable": 1}
            assert sorted({rep for r, rep, _ in replicas(kube) if r == role}) == [str(g) for g in range(n)]
    assert await _pass(kube) == []  # at rest again


async def test_the_lockstep_drives_each_group_s_partition() -> None:
    """What the LeaderWorkerSets carry, step by step: N + surge groups, the partition one group lower each step."""
    kube = await _started(body(16, 16, 1))
    _change_engine(kube)
    seen: list[tuple[int, int, int, int]] = []
    for _ in range(8):
        await _pass(kube)
        p, d = _workload(kube, "prefill")["spec"], _workload(kube, "decode")["spec"]
        part = [s["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] for s in (p, d)]
        seen.append((p["replicas"], part[0], d["replicas"], part[1]))
        kube.settle()
    assert seen[:5] == [(3, 2, 4, 3), (3, 1, 4, 2), (3, 0, 4, 1), (3, 0, 4, 0), (2, 0, 3, 0)]


async def test_a_crash_looping_group_revision_is_rolled_back() -> None:
    kube = await _started(body(16, 16, 1))
    old = _workload(kube, "decode")["spec"]["leaderWorkerTemplate"]
    _change_engine(kube, "vllm/vllm-openai:v0.33.0")  # its groups crash here
    await _pass(kube)
    kube.settle(ready=False)  # the surge groups start and crash
    kube.set_pod("llama-decode-3-1", restarts=lockstep.FAILED_RESTARTS)  # a worker of decode's surge group
    await _pass(kube)
    assert progressing(kube) == "EngineRevisionRolledBack"
    decode = _workload(kube, "decode")
    assert decode["spec"]["leaderWorkerTemplate"] == old and decode["spec"]["replicas"] == 3
    kube.settle()
    await _pass(kube)
    assert {p["spec"]["containers"][0]["image"] for p in kube.pods.values()} == {
        old["leaderTemplate"]["spec"]["containers"][0]["image"]
    }
    assert sorted({(r, rep) for r, rep, _ in replicas(kube)}) == [
        ("decode", "0"), ("decode", "1"), ("decode", "2"), ("prefill", "0"), ("prefill", "1"),
    ]  # fmt: skip
    assert await _pass(kube) in ([], ["status"])  # stays rolled back while the spec asks for the failed revision
    assert progressing(kube) == "EngineRevisionRolledBack"
    _change_engine(kube)  # a fixed revision rolls again
    await _pass(kube)
    lwt = _workload(kube, "decode")["spec"]["leaderWorkerTemplate"]
    assert lwt["leaderTemplate"]["spec"]["containers"][0]["image"] == NEW_IMAGE


async def test_a_surge_group_the_scheduler_cannot_place_is_dropped() -> None:
    kube = await _started(body(16, 16, 1))
    _change_engine(kube)
    await _pass(kube)
    kube.settle(ready=False)
    kube.set_pod("llama-decode-3-1", unschedulable=True)  # no free GPUs for one rank of decode's surge group
    pairs: list[int] = []
    passes = 0
    while progressing(kube) != "Complete":
        passes += 1
        assert passes < 20
        await _pass(kube)
        if passes == 1:
            assert _sizes(kube) == (2, 3)  # the surge groups are gone
            assert "no free GPUs" in progressing(kube, "message")
        kube.settle(ready=False)
        pairs.append(pairable(kube))
        kube.settle()
        await _pass(kube)
    assert min(pairs) >= 1, pairs  # in place: one group per pool at a time, a pair kept on the way
    assert {p["spec"]["containers"][0]["image"] for p in kube.pods.values()} == {NEW_IMAGE}
    assert _workload(kube, "decode")["metadata"]["annotations"].get(lockstep.SURGE) is None
