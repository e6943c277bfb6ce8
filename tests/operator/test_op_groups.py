"""Multi-node replicas: layouts, LeaderWorkerSet rendering, per-rank command lines, status and scaling in groups."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes, nvl72_nodes, spec  # type: ignore[import-not-found]

from xpyd_api import conditions as C
from xpyd_api import labels as L
from xpyd_api.layout import replica_layout
from xpyd_operator import engine_ranks, groups
from xpyd_operator.autoscaling.spec import pool_runtime
from xpyd_operator.desired import Observed, desire
from xpyd_operator.engines import vllm as vllm_engine
from xpyd_operator.placement import Demand, unschedulable_reason
from xpyd_operator.reconcile import Reconciler

IMG = "img:1"
DEEPSEEK = "deepseek-ai/DeepSeek-R1"


def wide_ep(topology: str, prefill_gpus: int, decode_gpus: int, kind: str = "vllm") -> dict[str, Any]:
    """DeepSeek-R1 with wide expert parallel (TP1 x DP=GPUs, EP) in both pools, as the seeds run it."""

    def pool(gpus: int) -> dict[str, Any]:
        return {"replicas": 1, "gpusPerReplica": gpus, "dataParallelSize": gpus, "expertParallel": True}

    return {
        "model": {"name": DEEPSEEK},
        "engine": {"kind": kind},
        "topology": {"kind": topology},
        "prefill": pool(prefill_gpus),
        "decode": pool(decode_gpus),
    }


@pytest.mark.parametrize(
    ("gpus", "tp", "pp", "dp", "per_node", "pods", "per_pod", "local"),
    [
        (8, None, 1, 8, 8, 1, 8, 8),  # one HGX node: a StatefulSet pod
        (16, None, 1, 16, 8, 2, 8, 8),  # two HGX nodes, DP16
        (32, None, 1, 32, 4, 8, 4, 4),  # eight GB200 trays, DP32
        (16, 16, 1, 1, 8, 2, 8, 1),  # TP16 over two nodes
        (16, 8, 2, 1, 8, 2, 8, 1),  # TP8 x PP2
        (4, None, 1, 1, None, 1, 4, 1),  # topology Any: one pod
    ],
)
def test_replica_layout(
    gpus: int, tp: int | None, pp: int, dp: int, per_node: int | None, pods: int, per_pod: int, local: int
) -> None:
    lay = replica_layout(gpus, tp, pp, dp, False, per_node)
    assert (lay.pods, lay.gpus_per_pod, lay.dp_local, lay.world_size) == (pods, per_pod, local, gpus)
    assert lay.workload_kind == ("LeaderWorkerSet" if pods > 1 else "StatefulSet")


def _cmd(manifest: dict[str, Any], rank: str) -> str:
    lwt = manifest["spec"]["leaderWorkerTemplate"]
    container = lwt[f"{rank}Template"]["spec"]["containers"][0]
    argv = container["command"]
    assert argv[:2] == ["/bin/sh", "-c"]
    return str(argv[2])


def _render(body: dict[str, Any], nodes: Any) -> dict[tuple[str, str], dict[str, Any]]:
    s = spec(**body)
    desired = desire(OWNER, s, Observed(nodes=nodes, lws_crd=True, compute_domain_crd=True), IMG, IMG)
    assert desired.error is None, desired.error
    return {(m["kind"], m["metadata"]["name"]): m for m in desired.children}


def test_vllm_wide_ep_on_hgx_renders_two_node_groups() -> None:
    out = _render(wide_ep("HGX-B200", 16, 16), b200_nodes(8))
    lws = out[("LeaderWorkerSet", "llama-prefill")]
    assert ("StatefulSet", "llama-prefill") not in out
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], lwt["size"], lwt["restartPolicy"]) == (1, 2, "RecreateGroupOnPodRestart")
    # groups at or above the partition take a new template; an engine change moves it (xpyd_operator.lockstep)
    assert lws["spec"]["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"partition": 0, "maxSurge": 0, "maxUnavailable": 1},
    }
    leader, worker = _cmd(lws, "leader"), _cmd(lws, "worker")
    for script in (leader, worker):
        words = script.split()
        assert words[0] == "exec" and "--data-parallel-size 16" in script and "--data-parallel-size-local 8" in script
        assert "--data-parallel-address ${LWS_LEADER_ADDRESS}" in script and "--enable-expert-parallel" in script
        assert f"--data-parallel-rpc-port {L.DP_RPC_PORT}" in script
    assert "--headless" not in leader and "--data-parallel-start-rank" not in leader
    assert "--headless --data-parallel-start-rank $(( ${LWS_WORKER_INDEX:-0} * 8 ))" in worker
    for role, kernel in (("prefill", "deepep_high_throughput"), ("decode", "deepep_low_latency")):
        template = out[("LeaderWorkerSet", f"llama-{role}")]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        assert f"--all2all-backend {kernel}" in _cmd(out[("LeaderWorkerSet", f"llama-{role}")], "worker")
        names = {e["name"] for e in template["spec"]["containers"][0]["env"]}
        assert "VLLM_ALL2ALL_BACKEND" not in names  # the variable is gone from today's vLLM: it would only warn
    leader_c = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker_c = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader_c["resources"]["limits"][L.GPU_RESOURCE] == "8" == worker_c["resources"]["limits"][L.GPU_RESOURCE]
    assert "readinessProbe" in leader_c and "readinessProbe" not in worker_c and "ports" not in worker_c
    assert {"name": "rank-join", "containerPort": L.DP_RPC_PORT, "protocol": "TCP"} in leader_c["ports"]
    env = {e["name"]: e.get("value") for e in worker_c["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NVSHMEM_REMOTE_TRANSPORT"] == "ibgda"
    assert "prometheus.io/scrape" not in (lwt["workerTemplate"]["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("kind", "image", "routing", "topology", "gpus", "nodes", "workload", "want"),
    [
        # vLLM passes X-data-parallel-rank on to its engines from v0.14.0 (the default image's is newer);
        # before, and for SGLang, the engine balances its ranks and the router subscribes to every rank's events
        ("vllm", "vllm/vllm-openai:v0.14.0", "auto", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "ranks"),
        ("vllm", "vllm/vllm-openai:v0.33.1", "auto", "HGX-B200", 8, b200_nodes(8), "StatefulSet", "ranks"),
        ("vllm", None, "auto", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "ranks"),
        ("vllm", "vllm/vllm-openai:v0.11.0", "auto", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "engine"),
        ("vllm", "vllm/vllm-openai:v0.13.0", "auto", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "engine"),
        ("vllm", "vllm/vllm-openai:v0.13.0", "ranks", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "ranks"),
        ("vllm", "vllm/vllm-openai:v0.14.0", "engine", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "engine"),
        ("emulator", None, "auto", "GB200-NVL72", 32, nvl72_nodes(), "LeaderWorkerSet", "ranks"),
        ("sglang", None, "auto", "HGX-B200", 16, b200_nodes(8), "LeaderWorkerSet", "engine"),
    ],
)
def test_the_api_pod_tells_the_router_its_data_parallel_ranks(
    kind: str, image: str | None, routing: str, topology: str, gpus: int, nodes: Any, workload: str, want: str
) -> None:
    body = wide_ep(topology, gpus, gpus, kind)
    body["engine"]["image"] = image
    body["router"] = {"dataParallelRouting": routing}
    manifest = _render(body, nodes)[(workload, "llama-prefill")]
    if workload == "LeaderWorkerSet":
        lwt = manifest["spec"]["leaderWorkerTemplate"]
        api, other = lwt["leaderTemplate"], lwt["workerTemplate"]
        assert L.DATA_PARALLEL_SIZE not in (other["metadata"].get("annotations") or {})
    else:
        api = manifest["spec"]["template"]
    annotations = api["metadata"]["annotations"]
    size, local = (32, 4) if topology == "GB200-NVL72" else (gpus, 8)
    got = (annotations[L.DATA_PARALLEL_SIZE], annotations[L.DATA_PARALLEL_LOCAL], annotations[L.DATA_PARALLEL_ROUTING])
    assert got == (str(size), str(local), want)


@pytest.mark.parametrize(
    ("image", "version"), [("registry.local/vllm:custom", "0.13.0"), ("r/v@sha256:" + "a" * 64, "0.14.0")]
)
def test_an_image_without_a_version_tag_takes_spec_engine_version(image: str, version: str) -> None:
    body = wide_ep("HGX-B200", 16, 16)
    body["engine"] = {"kind": "vllm", "image": image, "version": version}
    annotations = _render(body, b200_nodes(8))[("LeaderWorkerSet", "llama-prefill")]["spec"]["leaderWorkerTemplate"]
    got = annotations["leaderTemplate"]["metadata"]["annotations"]
    assert got[L.DATA_PARALLEL_ROUTING] == ("ranks" if version == "0.14.0" else "engine")  # the release decides


def test_gb200_groups_share_one_clique_and_hold_the_imex_channel() -> None:
    out = _render(wide_ep("GB200-NVL72", 16, 32), nvl72_nodes())
    cd = out[("ComputeDomain", "llama-imex")]
    assert cd["spec"]["numNodes"] == 4 + 8  # every pod of both groups
    for role in ("prefill", "decode"):
        lwt = out[("LeaderWorkerSet", f"llama-{role}")]["spec"]["leaderWorkerTemplate"]
        cliques = set()
        for rank in ("leader", "worker"):
            pod = lwt[f"{rank}Template"]
            assert pod["spec"]["resourceClaims"][0]["name"] == "imex-channel"
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["NCCL_MNNVL_ENABLE"] == "1" and "NVSHMEM_REMOTE_TRANSPORT" not in env
            cliques.add(pod["metadata"]["labels"][L.NVLINK_DOMAIN_LABEL])
        assert len(cliques) == 1
    assert out[("LeaderWorkerSet", "llama-decode")]["spec"]["leaderWorkerTemplate"]["size"] == 8


def test_sglang_ranks_join_by_dist_init_addr() -> None:
    out = _render(wide_ep("HGX-B200", 16, 16, kind="sglang"), b200_nodes(8))
    script = _cmd(out[("LeaderWorkerSet", "llama-prefill")], "worker")
    assert "--nnodes 2 --node-rank ${LWS_WORKER_INDEX:-0}" in script
    assert f"--dist-init-addr ${{LWS_LEADER_ADDRESS}}:{L.SGLANG_DIST_PORT}" in script
    assert "--tp-size 16 --attn-dp-size 16" in script and "--deepep-mode normal" in script  # SGLang 0.5.23's
    assert "--enable-dp-attention" not in script and "--enable-metrics" in script


@pytest.mark.parametrize(
    ("rank", "expected"),
    [
        (
            "leader",
            ["--nnodes", "2", "--node-rank", "${LWS_WORKER_INDEX:-0}", "--master-addr", "${LWS_LEADER_ADDRESS}"],
        ),
        ("worker", ["--headless"]),
    ],
)
def test_vllm_tensor_parallel_across_nodes(rank: str, expected: list[str]) -> None:
    lay = replica_layout(16, 16, 1, 1, False, 8)
    flags = vllm_engine.rank_flags(lay, "leader" if rank == "leader" else "worker")
    words = [w.text if isinstance(w, engine_ranks.Raw) else w for w in flags]
    assert all(e in words for e in expected)
    assert "--data-parallel-address" not in words


def test_shell_quotes_literals_and_keeps_expansions() -> None:
    argv = engine_ranks.shell(["vllm", "serve", "a model", '{"k":"v"}', engine_ranks.Raw("${X}")])
    assert shlex.split(argv[2]) == ["exec", "vllm", "serve", "a model", '{"k":"v"}', "${X}"]


def test_missing_leaderworkerset_api_blocks_with_the_install_hint() -> None:
    s = spec(**wide_ep("HGX-B200", 16, 8))
    desired = desire(OWNER, s, Observed(nodes=b200_nodes(8)), IMG, IMG)
    assert desired.error is not None
    reason, message = desired.error
    assert reason == "LeaderWorkerSetMissing" and "kubectl apply --server-side" in message and "prefill" in message


@pytest.mark.parametrize(
    ("demand", "nodes", "needle"),
    [
        (Demand("prefill", 1, 32, 1, 4), b200_nodes(3), "spans 4 nodes of 8 GPUs, but the cluster has only 3"),
        (Demand("prefill", 1, 16, 1, 2), b200_nodes(2), None),
    ],
)
def test_groups_need_enough_whole_nodes(demand: Demand, nodes: Any, needle: str | None) -> None:
    from xpyd_perf import TOPOLOGIES

    reason = unschedulable_reason(nodes, TOPOLOGIES["HGX-B200"], [demand])
    assert (reason is None) if needle is None else (needle in (reason or ""))


def test_a_group_larger_than_a_clique_is_unschedulable() -> None:
    from xpyd_perf import TOPOLOGIES

    reason = unschedulable_reason(nvl72_nodes(trays=6), TOPOLOGIES["GB200-NVL72"], [Demand("decode", 1, 32, 1, 8)])
    assert reason is not None and "one NVLink clique has only 6" in reason


def test_pending_pods_of_one_group_starve_one_replica() -> None:
    def pod(name: str, group: str | None) -> dict[str, Any]:
        lab = {L.ROLE: "prefill", **({L.LWS_GROUP_INDEX: group} if group is not None else {})}
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        return {"metadata": {"name": name, "labels": lab}, "status": {"phase": "Pending", "conditions": [cond]}}

    lws = {"kind": "LeaderWorkerSet", "spec": {"replicas": 3}, "status": {"readyReplicas": 1}}
    runtime = pool_runtime(lws, [pod("p-1", "1"), pod("p-1-1", "1"), pod("p-2-3", "2")], "prefill")
    assert (runtime.replicas, runtime.ready, runtime.unschedulable) == (3, 1, 2)
    assert pool_runtime({}, [pod("a", None), pod("b", None)], "prefill").unschedulable == 2


async def test_reconcile_reports_groups_and_layout() -> None:
    kube = FakeKube(wide_ep("GB200-NVL72", 16, 32), nvl72_nodes())
    kube.lws_crd = True
    rec = Reconciler(kube)
    await rec.reconcile(OWNER.namespace, OWNER.name)
    kube.settle()
    await rec.reconcile(OWNER.namespace, OWNER.name)
    assert kube.dd is not None
    status = kube.dd["status"]
    assert status["xpyd"] == "1P1D" and status["layout"] == "P 4x4 GPUs, D 8x4 GPUs"
    assert status["prefill"]["podsPerReplica"] == 4 and status["decode"]["podsPerReplica"] == 8
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds[C.READY] == ("True", "AllReplicasReady")
    assert conds[C.TOPOLOGY_SATISFIED] == ("True", "OneRack")


async def test_switching_to_multi_node_replaces_the_statefulset() -> None:
    body = wide_ep("HGX-B200", 8, 8)
    kube = FakeKube(body, b200_nodes(8))
    kube.lws_crd = True
    rec = Reconciler(kube)
    await rec.reconcile(OWNER.namespace, OWNER.name)
    assert ("StatefulSet", "llama-prefill") in kube.objects
    assert kube.dd is not None
    kube.dd["spec"] = wide_ep("HGX-B200", 16, 8)
    outcome = await rec.reconcile(OWNER.namespace, OWNER.name)
    assert outcome is not None and "StatefulSet/llama-prefill" in outcome.deleted
    assert ("LeaderWorkerSet", "llama-prefill") in kube.objects and ("StatefulSet", "llama-decode") in kube.objects


def test_templates_and_rollout_status_of_both_kinds() -> None:
    lws: dict[str, Any] = {
        "kind": groups.KIND,
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {"size": 3, "leaderTemplate": {"a": 1}, "workerTemplate": {"b": 2}},
        },
        "status": {
            "readyReplicas": 2,
            "updatedReplicas": 2,
            "conditions": [{"type": "UpdateInProgress", "status": "True"}],
        },
    }
    assert groups.templates(lws) == [{"a": 1}, {"b": 2}] and groups.pods_per_replica(lws) == 3
    assert groups.rolled(lws) == (False, True)
    lws["status"]["conditions"] = []
    assert groups.rolled(lws) == (True, True)


def test_multi_node_environment_never_repeats_a_name() -> None:
    body = {**wide_ep("HGX-B200", 16, 16), "network": {"profile": "InfiniBand"}}
    out = _render(body, b200_nodes(8))
    lwt = out[("LeaderWorkerSet", "llama-prefill")]["spec"]["leaderWorkerTemplate"]
    for rank in ("leader", "worker"):
        names = [e["name"] for e in lwt[f"{rank}Template"]["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        assert "NCCL_SOCKET_IFNAME" in names


@pytest.mark.parametrize(
    ("image", "tp", "dp", "refused"),
    [
        (None, 16, 1, False),  # the default (newest) image
        ("vllm/vllm-openai:v0.11.0", 16, 1, True),  # tensor parallel across nodes needs Ray there
        ("vllm/vllm-openai:v0.11.1", 16, 1, False),
        ("vllm/vllm-openai:v0.12.0-cu129", 16, 1, False),
        ("vllm/vllm-openai:v0.11.0", 1, 16, False),  # data parallel across nodes works on v0.11.0
    ],
)
def test_vllm_too_old_for_tensor_parallel_across_nodes(image: str | None, tp: int, dp: int, refused: bool) -> None:
    pool = {"replicas": 1, "gpusPerReplica": 16, "tensorParallelSize": tp, "dataParallelSize": dp}
    body = {"engine": {"kind": "vllm", **({"image": image} if image else {})}, "prefill": pool}
    desired = desire(OWNER, spec(**body), Observed(nodes=b200_nodes(8), lws_crd=True), IMG, IMG)
    assert (desired.error is not None and desired.error[0] == "EngineTooOld") is refused
    if refused:
        assert desired.error is not None and "vllm 0.11.0" in desired.error[1] and "prefill" in desired.error[1]
