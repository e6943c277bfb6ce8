"""Multi-node replicas end to end: DeepSeek-R1 wide expert parallel as LeaderWorkerSet groups.

On GB200-NVL72 both pools' groups land in one NVLink clique; on HGX-B200 each replica is a group of
two 8-GPU nodes. Both become Ready and serve through the router (the emulator runs every rank: the
leader waits for its ranks before it reports healthy). Killing one rank recreates its whole group
while the pool's other group keeps serving, and the autoscaler adds a whole prefill group under load
and removes it after. Needs the LeaderWorkerSet controller (the local cluster runs it; on kind or a
real cluster install LeaderWorkerSet v0.7.0+ first) and, for the autoscaling phase, a Prometheus
that discovers annotated pods (XPYD_PROMETHEUS_URL, default the local cluster's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError

from .kube import find_json, kubectl
from .load_clients import Load, drive_until, pod_urls, wait_until
from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube)
from .operator_fixtures import DD, Kube, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "deepseek-ai/DeepSeek-R1-0528"
FP4 = "nvidia/DeepSeek-R1-FP4"
PROMETHEUS = os.environ.get("XPYD_PROMETHEUS_URL", "http://127.0.0.1:9090")
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
CLIQUE = "nvidia.com/gpu.clique"


def wide_ep(gpus: int, **extra: Any) -> dict[str, Any]:
    return {"gpusPerReplica": gpus, "dataParallelSize": gpus, "expertParallel": True, **extra}


def manifest(name: str, ns: str, topology: str, model: str, prefill: dict[str, Any], decode: dict[str, Any],
             **spec: Any) -> dict[str, Any]:  # fmt: skip
    body = {"model": {"name": model}, "engine": {"kind": "vllm", "args": ["--max-model-len", "32768"]},
            "topology": {"kind": topology}, "prefill": prefill, "decode": decode,
            "router": {"replicas": 1, "policy": "kv-aware"}, **spec}  # fmt: skip
    return {"apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment",
            "metadata": {"name": name, "namespace": ns}, "spec": body}  # fmt: skip


@pytest.fixture(scope="module")
def ns(op_kube: Kube) -> Iterator[str]:
    if find_json("crd", LWS_CRD) is None:
        pytest.fail(f"the LeaderWorkerSet API ({LWS_CRD}) is not installed: install LeaderWorkerSet v0.7.0+")
    name = op_kube.create_namespace("xpyd-mn")
    yield name
    op_kube.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess([ns], tmp_path_factory.mktemp("operator-mn") / "operator.log").start()
    yield proc
    proc.stop()


def groups_of(ns: str, name: str, role: str) -> dict[str, list[dict[str, Any]]]:
    """Running pods of a pool by group index."""
    pods = find_json("pods", "-n", ns, "-l", f"xpyd.io/deployment={name},xpyd.io/role={role}") or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for p in pods.get("items", []):
        if p["metadata"].get("deletionTimestamp"):
            continue
        out.setdefault(p["metadata"]["labels"].get(GROUP_INDEX, "?"), []).append(p)
    return out


def ready(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    status = kube.get_dd(ns, name).get("status") or {}
    conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status if conds.get("Ready") == "True" else None


async def until_ready(
    kube: Kube, ns: str, name: str, operator: OperatorProcess, limit_s: float = 300
) -> dict[str, Any]:
    try:
        found: dict[str, Any] = await wait_until(f"{name} Ready=True", lambda: ready(kube, ns, name), limit_s)
    except AssertionError:
        status = kube.get_dd(ns, name).get("status")
        raise AssertionError(f"{name}: status {status}\noperator:\n{operator.log_tail()}") from None
    return found


def lws_replicas(ns: str, name: str) -> int:
    lws = find_json("leaderworkerset", name, "-n", ns) or {}
    return int(lws.get("spec", {}).get("replicas", 0))


async def through_router(ns: str, name: str, model: str, count: int) -> Load:
    load = Load(ns, name, "router", model, prompt_tokens=200, max_tokens=8, concurrency=4, limit=count)
    stop = asyncio.Event()
    await asyncio.wait_for(load.run(stop), 180)
    return load


def router_metrics(ns: str, name: str) -> str:
    """The /metrics text of the deployment's (first) router pod."""
    [url, *_] = pod_urls(ns, name, "router")
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def samples(text: str, metric: str, **want: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of `metric` whose labels include `want`."""
    out = []
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
            if all(labels.get(k) == v for k, v in want.items()):
                out.append((labels, float(line.rsplit(" ", 1)[1])))
    return out


def sample(text: str, metric: str, **want: str) -> float:
    return sum(value for _, value in samples(text, metric, **want))


def delete(kube: Kube, ns: str, name: str) -> None:
    with contextlib.suppress(ApiError):
        kube.client.delete(DD, name, namespace=ns)


@pytest.mark.timeout(600)
async def test_nvl72_groups_share_one_clique_and_serve(op_kube: Kube, ns: str, operator: OperatorProcess) -> None:
    name = "dsr1-nvl72"
    # engine.kind emulator: the router keys prompts by the emulator's tokens and routes to each rank, which the
    # emulator pins as vLLM >= 0.14 does (the HGX test below runs kind vllm's default v0.11.0: one target each).
    engine = {"kind": "emulator", "args": ["--max-model-len", "32768"]}
    op_kube.apply_dd(
        manifest(name, ns, "GB200-NVL72", FP4, wide_ep(8, replicas=1), wide_ep(16, replicas=1), engine=engine)
    )
    try:
        status = await until_ready(op_kube, ns, name, operator)
        assert status["xpyd"] == "1P1D" and status["layout"] == "P 2x4 GPUs, D 4x4 GPUs"
        assert status["prefill"]["podsPerReplica"] == 2 and status["decode"]["podsPerReplica"] == 4
        assert status["placement"]["kvPath"] == "NVLink"
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in (find_json("nodes") or {})["items"]}
        cliques = set()
        for role, size in (("prefill", 2), ("decode", 4)):
            (group,) = groups_of(ns, name, role).values()
            assert len(group) == size, f"{role}: one group of {size} pods"
            cliques |= {nodes[p["spec"]["nodeName"]][CLIQUE] for p in group}
            assert sorted(p["metadata"]["labels"][WORKER_INDEX] for p in group) == [str(i) for i in range(size)]
        assert len(cliques) == 1, f"every pod of both pools in one NVLink clique, got {cliques}"
        load = await through_router(ns, name, FP4, 24)
        assert load.codes == {"200": 24}, load.codes
        # The router routes to each data-parallel rank (8 prefill, 16 decode) and hears each rank's KV events
        # from the pod that runs it (decode ranks 4-15 on pods 1-3, relayed there as vLLM publishes them).
        metrics = await asyncio.to_thread(router_metrics, ns, name)
        for role, ranks in (("prefill", 8), ("decode", 16)):
            ready = sample(metrics, "xpyd_router_workers", role=role, state="ready")
            assert ready == ranks, f"{role}: {ready} routing targets, want one per rank"
        stored = {
            labels["worker"]: value
            for labels, value in samples(metrics, "xpyd_router_kv_event_blocks_total", outcome="stored")
        }
        assert len(stored) == 24, sorted(stored)
        (group,) = groups_of(ns, name, "decode").values()  # 200-token prompts skip prefill: decode computes them
        leader = next(p for p in group if p["metadata"]["labels"][WORKER_INDEX] == "0")
        decode = f"http://{leader['status']['podIP']}:8000#dp"
        members = sum(stored.get(f"{decode}{rank}", 0.0) for rank in range(4, 16))
        assert members > 0, f"no events relayed from the decode group's pods 1-3: {stored}"
    finally:
        delete(op_kube, ns, name)


@pytest.mark.timeout(1200)
async def test_hgx_groups_recreate_whole_and_scale_in_groups(op_kube: Kube, ns: str, operator: OperatorProcess) -> None:
    name = "dsr1-hgx"
    prefill = wide_ep(16, replicas=2, autoscaling={"minReplicas": 2, "maxReplicas": 3})
    scaling = {"enabled": True, "prometheusUrl": PROMETHEUS, "intervalSeconds": 5, "stabilizationSeconds": 30}
    op_kube.apply_dd(manifest(name, ns, "HGX-B200", MODEL, prefill, wide_ep(16, replicas=1), autoscaling=scaling))
    try:
        status = await until_ready(op_kube, ns, name, operator)
        assert status["xpyd"] == "2P1D" and status["layout"] == "P 2x8 GPUs, D 2x8 GPUs"
        before = groups_of(ns, name, "prefill")
        assert sorted(before) == ["0", "1"] and all(len(g) == 2 for g in before.values())
        assert all(len({p["spec"]["nodeName"] for p in g}) == 2 for g in before.values()), "one node per pod"
        warm = await through_router(ns, name, MODEL, 12)
        assert warm.codes == {"200": 12}, warm.codes

        # Kill one rank of group 1: LeaderWorkerSet recreates the whole group; group 0 keeps serving.
        old1 = {p["metadata"]["uid"] for p in before["1"]}  # the group key survives a recreation: uids do not
        uids0 = {p["metadata"]["uid"] for p in before["0"]}
        victim = next(p for p in before["1"] if p["metadata"]["labels"][WORKER_INDEX] == "1")
        kubectl("delete", "pod", victim["metadata"]["name"], "-n", ns, "--wait=false")

        def recreated() -> bool:
            now = groups_of(ns, name, "prefill").get("1", [])
            fresh = [p for p in now if p["metadata"]["uid"] not in old1]
            return len(fresh) == 2 and all(p["status"].get("podIP") for p in fresh)

        during = Load(ns, name, "router", MODEL, prompt_tokens=200, max_tokens=8, concurrency=2, limit=400)
        await drive_until(during, "prefill group 1 recreated whole", recreated, 240)
        assert {p["metadata"]["uid"] for p in groups_of(ns, name, "prefill")["0"]} == uids0, "group 0 untouched"
        assert during.ok > 0 and set(during.codes) == {"200"}, f"group 0 kept serving: {during.codes}"
        await until_ready(op_kube, ns, name, operator)

        # Long prompts on the prefill leaders: the autoscaler adds a whole group, then removes it.
        assert lws_replicas(ns, f"{name}-prefill") == 2
        heavy = Load(ns, name, "prefill", MODEL, prompt_tokens=6000, max_tokens=1, concurrency=24)
        await drive_until(heavy, "a third prefill group", lambda: lws_replicas(ns, f"{name}-prefill") == 3, 240)
        assert heavy.ok > 0
        third = await wait_until(
            "the third group's 2 pods", lambda: len(groups_of(ns, name, "prefill").get("2", [])) == 2, 120
        )
        assert third
        await wait_until("prefill back to 2 groups", lambda: lws_replicas(ns, f"{name}-prefill") == 2, 300)
        await wait_until("the third group's pods gone", lambda: "2" not in groups_of(ns, name, "prefill"), 120)
        assert len(pod_urls(ns, name, "prefill")) == 2, "one API pod per group"
    finally:
        delete(op_kube, ns, name)
