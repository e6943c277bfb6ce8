"""The reconcile loop against an in-memory API server: convergence, zero writes at rest, faults."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes, nvl72_nodes, progressing, walk_roll  # type: ignore[import-not-found]

from xpyd_api import conditions as C
from xpyd_operator.handlers import wants_reconcile
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_operator.workqueue import WorkQueue, backoff

SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "topology": {"kind": "HGX-B200"},
    "prefill": {"replicas": 1, "gpusPerReplica": 2},
    "decode": {"replicas": 2, "gpusPerReplica": 2},
}
CONFIG = Config(own_image="ghcr.io/xpyd/xpyd:t")


async def _pass(kube: FakeKube) -> list[str]:
    kube.writes.clear()
    await Reconciler(kube, CONFIG).reconcile(OWNER.namespace, OWNER.name)
    return list(kube.writes)


def _ready(kube: FakeKube) -> str:
    assert kube.dd is not None
    return str(next(c["status"] for c in kube.dd["status"]["conditions"] if c["type"] == C.READY))


async def test_converges_then_writes_nothing() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    first = await _pass(kube)
    assert first.count("status") == 1
    assert len(first) == 12  # 11 children + status
    assert _ready(kube) == "False"
    kube.settle()
    assert await _pass(kube) == ["status"]
    assert _ready(kube) == "True"
    assert kube.dd is not None
    assert kube.dd["status"]["xpyd"] == "1P2D"
    assert await _pass(kube) == []  # steady state: not one write
    assert any(r == "AllReplicasReady" for _, r, _ in kube.events)


async def test_omitted_replicas_are_left_to_the_scaler() -> None:
    spec = {**SPEC, "decode": {"gpusPerReplica": 2}}
    kube = FakeKube(spec, b200_nodes())
    await _pass(kube)
    sts = kube.objects[("StatefulSet", "llama-decode")]
    assert "replicas" not in sts["spec"]
    kube.settle()
    sts["spec"]["replicas"] = 7  # an autoscaler scaled it
    await _pass(kube)
    assert await _pass(kube) == []
    assert kube.objects[("StatefulSet", "llama-decode")]["spec"]["replicas"] == 7


async def test_set_replicas_drift_is_corrected_and_edits_roll() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    await _pass(kube)
    kube.settle()
    kube.objects[("StatefulSet", "llama-prefill")]["spec"]["replicas"] = 5
    assert "apply StatefulSet/llama-prefill" in await _pass(kube)
    assert kube.objects[("StatefulSet", "llama-prefill")]["spec"]["replicas"] == 1
    assert kube.dd is not None
    kube.dd["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.33.1"}
    writes = await _pass(kube)
    assert {"apply StatefulSet/llama-decode", "apply StatefulSet/llama-prefill"} <= set(writes)  # in step


def _engine_image(kube: FakeKube, role: str) -> str:
    return str(kube.objects[("StatefulSet", f"llama-{role}")]["spec"]["template"]["spec"]["containers"][0]["image"])


@pytest.mark.parametrize(("surge", "least_pairs"), [(1, 2), (0, 1)])
async def test_an_engine_upgrade_steps_both_pools_together_and_keeps_pairs(surge: int, least_pairs: int) -> None:
    spec = {**SPEC, "prefill": {"replicas": 2, "gpusPerReplica": 2}, "decode": {"replicas": 3, "gpusPerReplica": 2}}
    kube = FakeKube({**spec, "rollout": {"maxSurge": surge}}, b200_nodes())
    kube.simulate_pods = True
    await _pass(kube)
    kube.settle()
    await _pass(kube)
    assert progressing(kube) == "Complete"
    assert kube.dd is not None
    kube.dd["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.33.1"}
    kube.dd["metadata"]["generation"] = 2
    pairs, reasons = await walk_roll(kube, _pass)
    assert min(pairs) >= least_pairs, pairs  # a revision with a prefill and a decode pod at every step
    assert "EngineUpgradeInStep" in reasons
    images = {p["spec"]["containers"][0]["image"] for p in kube.pods.values()}
    assert images == {"vllm/vllm-openai:v0.33.1"}
    for role, n in (("prefill", 2), ("decode", 3)):
        sts = kube.objects[("StatefulSet", f"llama-{role}")]
        assert sts["spec"]["replicas"] == n and "rollingUpdate" not in sts["spec"]["updateStrategy"]
        assert not any(k.startswith("xpyd.io/rollback") for k in sts["metadata"]["annotations"])
        assert sorted(p for p in kube.pods if p.startswith(f"llama-{role}-")) == [f"llama-{role}-{i}" for i in range(n)]
    assert await _pass(kube) == []  # at rest again


async def test_a_crash_looping_engine_revision_is_rolled_back() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    kube.simulate_pods = True
    await _pass(kube)
    kube.settle()
    await _pass(kube)
    old = _engine_image(kube, "decode")
    assert kube.dd is not None
    kube.dd["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.33.0"}  # its pods crash here
    kube.dd["metadata"]["generation"] = 2
    await _pass(kube)
    kube.settle(ready=False)  # the surge pods start and crash
    kube.set_pod("llama-decode-2", restarts=3)
    await _pass(kube)
    assert progressing(kube) == "EngineRevisionRolledBack"
    kube.settle()
    await _pass(kube)
    assert {p["spec"]["containers"][0]["image"] for p in kube.pods.values()} == {old}
    assert _engine_image(kube, "decode") == _engine_image(kube, "prefill") == old
    assert sorted(kube.pods) == ["llama-decode-0", "llama-decode-1", "llama-prefill-0"]
    assert await _pass(kube) in ([], ["status"])  # stays rolled back while the spec asks for the failed revision
    assert progressing(kube) == "EngineRevisionRolledBack"
    kube.dd["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.33.1"}  # a fixed revision rolls again
    await _pass(kube)
    assert _engine_image(kube, "decode") == "vllm/vllm-openai:v0.33.1"


async def test_resize_is_not_held_by_the_upgrade_rule() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    await _pass(kube)
    kube.settle()
    assert kube.dd is not None
    kube.dd["spec"]["prefill"] = {"replicas": 3, "gpusPerReplica": 2}
    kube.dd["spec"]["decode"] = {"replicas": 3, "gpusPerReplica": 2}
    writes = await _pass(kube)
    assert {"apply StatefulSet/llama-prefill", "apply StatefulSet/llama-decode"} <= set(writes)


async def test_hand_deleted_child_is_recreated() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    await _pass(kube)
    kube.settle()
    await _pass(kube)
    del kube.objects[("StatefulSet", "llama-decode")]
    del kube.objects[("Role", "llama-router")]
    writes = await _pass(kube)
    assert {"apply StatefulSet/llama-decode", "apply Role/llama-router"} <= set(writes)


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ({"model": {"name": "acme/mystery-7b"}}, "UnknownModel"),
        ({"prefill": {"replicas": 1, "gpusPerReplica": 16}, "topology": {"kind": "Any"}}, "Unschedulable"),
        (
            {"prefill": {"replicas": 1, "gpusPerReplica": 8}, "topology": {"kind": "GB200-NVL72"}},
            "LeaderWorkerSetMissing",
        ),
        ({"prefill": {"replicas": 1, "gpusPerReplica": 99}}, "InvalidSpec"),
    ],
)
async def test_bad_edit_leaves_children_untouched(patch: dict[str, Any], reason: str) -> None:
    kube = FakeKube(dict(SPEC), b200_nodes() + nvl72_nodes())
    await _pass(kube)
    kube.settle()
    await _pass(kube)
    before = {k: v["metadata"]["annotations"] for k, v in kube.objects.items()}
    assert kube.dd is not None
    kube.dd["spec"].update(patch)
    assert await _pass(kube) == ["status"]
    assert {k: v["metadata"]["annotations"] for k, v in kube.objects.items()} == before
    ready = next(c for c in kube.dd["status"]["conditions"] if c["type"] == C.READY)
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert await _pass(kube) == []


async def test_mode_switch_prunes_the_old_pools() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    await _pass(kube)
    assert kube.dd is not None
    kube.dd["spec"] = {
        "model": SPEC["model"],
        "mode": "Colocated",
        "worker": {"replicas": 2, "gpusPerReplica": 2},
    }
    writes = await _pass(kube)
    assert "delete StatefulSet/llama-prefill" in writes
    assert "apply StatefulSet/llama-worker" in writes


async def test_nvl72_pins_both_pools_to_one_clique() -> None:
    spec = {**SPEC, "topology": {"kind": "GB200-NVL72"}, "prefill": {"replicas": 2, "gpusPerReplica": 4},
            "decode": {"replicas": 2, "gpusPerReplica": 4}}  # fmt: skip
    kube = FakeKube(spec, nvl72_nodes())
    await _pass(kube)
    pins = {
        kube.objects[("StatefulSet", f"llama-{r}")]["spec"]["template"]["metadata"]["labels"]["xpyd.io/nvlink-domain"]
        for r in ("prefill", "decode")
    }
    assert len(pins) == 1
    assert kube.dd is not None
    assert kube.dd["status"]["placement"]["kvPath"] == "NVLink"


async def test_deleted_object_is_a_no_op() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    kube.dd = None
    assert await Reconciler(kube, CONFIG).reconcile("ns1", "llama") is None


async def test_queue_retries_failed_api_calls_with_backoff() -> None:
    kube = FakeKube(dict(SPEC), b200_nodes())
    kube.fail_next_apply = 2
    reconciler = Reconciler(kube, CONFIG)
    done = asyncio.Event()

    async def work(ns: str, name: str) -> None:
        await reconciler.reconcile(ns, name)
        done.set()

    queue = WorkQueue(work, base_delay=0.01, max_delay=0.02)
    queue.add(("ns1", "llama"))
    await asyncio.wait_for(done.wait(), 5)
    await queue.close()
    assert ("StatefulSet", "llama-decode") in kube.objects


async def test_queue_coalesces_requests_for_one_object() -> None:
    calls: list[str] = []
    gate = asyncio.Event()

    async def work(ns: str, name: str) -> None:
        calls.append(name)
        await gate.wait()

    queue = WorkQueue(work)
    for _ in range(3):
        queue.add(("ns", "a"))  # merged: the pass has not started yet
    await asyncio.sleep(0.01)
    assert calls == ["a"]
    for _ in range(3):
        queue.add(("ns", "a"))  # merged into one follow-up of the running pass
    gate.set()
    await queue.join()
    assert calls == ["a", "a"]


@pytest.mark.parametrize(("n", "delay"), [(1, 0.5), (2, 1.0), (4, 4.0), (20, 60.0)])
def test_backoff(n: int, delay: float) -> None:
    assert backoff(n) == delay


@pytest.mark.parametrize(
    ("event_type", "generation", "observed", "want"),
    [
        (None, 1, 1, True),
        ("ADDED", 1, None, True),
        ("MODIFIED", 2, 1, True),
        ("MODIFIED", 2, 2, False),
        ("DELETED", 3, 1, False),
    ],
)
def test_wants_reconcile(event_type: str | None, generation: int, observed: int | None, want: bool) -> None:
    body = {"metadata": {"generation": generation}, "status": {"observedGeneration": observed}}
    assert wants_reconcile(event_type, body) is want


@pytest.mark.parametrize(("installed", "reason"), [(True, "Created"), (False, "ComputeDomainCRDMissing")])
async def test_nvl72_compute_domain_only_when_its_crd_exists(installed: bool, reason: str) -> None:
    spec = {**SPEC, "topology": {"kind": "GB200-NVL72"}, "prefill": {"replicas": 2, "gpusPerReplica": 4},
            "decode": {"replicas": 2, "gpusPerReplica": 4}}  # fmt: skip
    kube = FakeKube(spec, nvl72_nodes())
    kube.compute_domain_crd = installed
    await _pass(kube)
    assert (("ComputeDomain", "llama-imex") in kube.objects) is installed
    pod = kube.objects[("StatefulSet", "llama-decode")]["spec"]["template"]["spec"]
    assert ("resourceClaims" in pod) is installed
    assert kube.dd is not None
    cond = next(c for c in kube.dd["status"]["conditions"] if c["type"] == C.COMPUTE_DOMAIN)
    assert cond["reason"] == reason
