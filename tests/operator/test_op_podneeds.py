"""What a real engine pod gets without a pod patch: shm, token, cache, fabric, topology env, probes, scheduling."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakekube import CLIQUE_A, OWNER, spec  # type: ignore[import-not-found]

from xpyd_api import labels as L
from xpyd_api.podmodels import NetworkSpec
from xpyd_operator import podneeds, pools, sizing
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.desired import with_defaults

IMG = "ghcr.io/xpyd/xpyd:test"
TOKEN = {"name": "hf-token", "key": "token"}


def _pod(s: Any, role: str = "decode", clique: str | None = None, cd: bool = False) -> dict[str, Any]:
    return dict(pools.pod_template(PoolBuild(OWNER, s, role, IMG, clique=clique, compute_domain=cd)))


def _main(template: dict[str, Any]) -> dict[str, Any]:
    return dict(template["spec"]["containers"][0])


def _env(template: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _main(template)["env"]}


def _volumes(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in template["spec"]["volumes"]}


def test_tensor_parallel_8_gets_shm_token_and_cache_without_a_patch() -> None:
    s = spec(model={"name": "meta-llama/Llama-3.1-70B-Instruct", "tokenSecret": TOKEN})
    t = _pod(s)
    assert s.decode is not None and s.decode.tp == 8
    assert _volumes(t)[pools.SHM_VOLUME]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert _env(t)["HF_TOKEN"] == {"secretKeyRef": TOKEN}
    assert _volumes(t)[podneeds.CACHE_VOLUME]["emptyDir"]["sizeLimit"] == "168Gi"  # 141 GB x 1.2 + 10Gi
    assert _env(t)["HF_HOME"] == "/model-cache"
    assert {"name": podneeds.CACHE_VOLUME, "mountPath": "/model-cache"} in _main(t)["volumeMounts"]


@pytest.mark.parametrize(
    ("gpus", "override", "size"),
    [(1, None, "8Gi"), (4, None, "8Gi"), (8, None, "16Gi"), (8, "64Gi", "64Gi")],
)
def test_shm_is_sized_from_the_pools_gpus(gpus: int, override: str | None, size: str) -> None:
    engine = {"sharedMemorySize": override} if override else {}
    s = spec(engine=engine, decode={"replicas": 1, "gpusPerReplica": gpus})
    assert _volumes(_pod(s))[pools.SHM_VOLUME]["emptyDir"] == {"medium": "Memory", "sizeLimit": size}


@pytest.mark.parametrize(
    ("cache", "volume", "mount", "offline"),
    [
        ({"persistentVolumeClaim": {"claimName": "models"}},
         {"persistentVolumeClaim": {"claimName": "models", "readOnly": False}}, {}, False),
        ({"persistentVolumeClaim": {"claimName": "models", "readOnly": True}, "mountPath": "/data"},
         {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}, {"readOnly": True}, True),
        ({"hostPath": {"path": "/var/lib/models"}},
         {"hostPath": {"path": "/var/lib/models", "type": "DirectoryOrCreate"}}, {}, False),
        ({"emptyDir": {"sizeLimit": "500Gi"}}, {"emptyDir": {"sizeLimit": "500Gi"}}, {}, False),
    ],
)  # fmt: skip
def test_model_cache_sources(
    cache: dict[str, Any], volume: dict[str, Any], mount: dict[str, Any], offline: bool
) -> None:
    s = spec(model={"name": "meta-llama/Llama-3.1-70B-Instruct", "cache": cache})
    t = _pod(s)
    path = cache.get("mountPath", "/model-cache")
    assert _volumes(t)[podneeds.CACHE_VOLUME] == {"name": podneeds.CACHE_VOLUME, **volume}
    assert {"name": podneeds.CACHE_VOLUME, "mountPath": path, **mount} in _main(t)["volumeMounts"]
    assert _env(t)["HF_HOME"] == path
    assert ("HF_HUB_OFFLINE" in _env(t)) is offline


@pytest.mark.parametrize(("cache", "mounted"), [(None, False), ({"emptyDir": {}}, True)])
def test_the_emulator_gets_a_cache_only_when_asked(cache: dict[str, Any] | None, mounted: bool) -> None:
    model: dict[str, Any] = {"name": "meta-llama/Llama-3.1-8B-Instruct", **({"cache": cache} if cache else {})}
    t = _pod(spec(model=model, engine={"kind": "emulator"}))
    assert (podneeds.CACHE_VOLUME in _volumes(t)) is mounted
    assert ("HF_HOME" in _env(t)) is mounted


def test_a_model_outside_the_catalog_gets_an_unsized_cache_and_30_minutes() -> None:
    s = spec(model={"name": "acme/secret-model", "kvBytesPerToken": 1000})
    t = _pod(s)
    assert _volumes(t)[podneeds.CACHE_VOLUME]["emptyDir"] == {}
    probe = _main(t)["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == sizing.STARTUP_UNKNOWN_S


@pytest.mark.parametrize(
    ("model", "pool", "seconds"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", {}, 600 + 161),  # 16 GB at 100 MB/s
        ("meta-llama/Llama-3.1-70B-Instruct", {}, 600 + 1412),
        ("deepseek-ai/DeepSeek-R1-0528", {"dataParallelSize": 8, "expertParallel": True}, 600 + 1800 + 6710),
    ],
)
def test_startup_probe_is_sized_from_the_weights(model: str, pool: dict[str, Any], seconds: int) -> None:
    s = spec(model={"name": model}, decode={"replicas": 1, "gpusPerReplica": 8, **pool})
    probe = _main(_pod(s))["startupProbe"]
    assert probe["periodSeconds"] == 10
    assert probe["failureThreshold"] == -(-seconds // 10)


FABRICS = [
    (None, {}, {}, [], {}),
    ({"profile": "InfiniBand"}, {"rdma/ib": "1"}, {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"},
     ["IPC_LOCK"], {}),
    ({"profile": "RoCE"}, {"rdma/roce_gdr": "8"}, {"NCCL_SOCKET_IFNAME": "eth0"}, ["IPC_LOCK"], {}),
    ({"profile": "AWS-EFA", "devicesPerGpu": 4}, {"vpc.amazonaws.com/efa": "32"}, {"FI_PROVIDER": "efa"},
     ["IPC_LOCK"], {}),
    ({"profile": "GKE-RDMA"}, {"networking.gke.io.networks/rdma-7": "1", "networking.gke.io.networks/rdma-7.IP": "1"},
     {"UCX_TLS": "rc_mlx5,rc,cuda_copy,cuda_ipc,sm,shm,self"}, ["IPC_LOCK", "NET_ADMIN"],
     {"networking.gke.io/default-interface": "eth0"}),
    ({"profile": "Custom", "resources": {"rdma/hca_shared_devices_a": "1"}, "capabilities": ["SYS_RAWIO"],
      "annotations": {"k8s.v1.cni.cncf.io/networks": "multi-nic-compute"}, "env": {"UCX_NET_DEVICES": "mlx5_0:1"}},
     {"rdma/hca_shared_devices_a": "1"}, {"UCX_NET_DEVICES": "mlx5_0:1"}, ["IPC_LOCK", "SYS_RAWIO"],
     {"k8s.v1.cni.cncf.io/networks": "multi-nic-compute"}),
]  # fmt: skip


@pytest.mark.parametrize(("network", "resources", "env", "caps", "annotations"), FABRICS)
def test_network_profiles(
    network: dict[str, Any] | None,
    resources: dict[str, str],
    env: dict[str, str],
    caps: list[str],
    annotations: dict[str, str],
) -> None:
    t = _pod(spec(**({"network": network} if network else {})))
    main = _main(t)
    for name, quantity in resources.items():
        assert main["resources"]["requests"][name] == main["resources"]["limits"][name] == quantity
    if network is None:
        assert set(main["resources"]["requests"]) == {L.GPU_RESOURCE}
    assert {k: _env(t).get(k) for k in env} == env
    assert main["securityContext"]["capabilities"].get("add", []) == caps
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {k: t["metadata"]["annotations"].get(k) for k in annotations} == annotations


def test_gke_attaches_one_rdma_network_per_gpu() -> None:
    t = _pod(spec(network={"profile": "GKE-RDMA"}, decode={"replicas": 1, "gpusPerReplica": 4}))
    interfaces = json.loads(t["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [i["network"] for i in interfaces] == ["default", "rdma-0", "rdma-1", "rdma-2", "rdma-3"]
    gke = [r for r in _main(t)["resources"]["requests"] if r.startswith("networking.gke.io")]
    assert len(gke) == 8  # rdma-i and rdma-i.IP for each of the 4 NICs


def test_what_the_user_writes_wins_over_the_profile() -> None:
    s = spec(
        network={"profile": "InfiniBand"},
        engine={"resources": {"rdma/ib": "2"}, "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "bond0"}]},
    )
    main = _main(_pod(s))
    assert main["resources"]["requests"]["rdma/ib"] == main["resources"]["limits"]["rdma/ib"] == "2"
    names = [e["name"] for e in main["env"]]
    assert len(names) == len(set(names)), "server-side apply refuses duplicate env names"
    assert {e["name"]: e.get("value") for e in main["env"]}["NCCL_SOCKET_IFNAME"] == "bond0"


@pytest.mark.parametrize(
    ("spec_network", "default", "profile"),
    [(None, None, None), (None, "RoCE", "RoCE"), ({"profile": "None"}, "RoCE", "None"),
     ({"profile": "AWS-EFA"}, '{"profile": "RoCE"}', "AWS-EFA")],
)  # fmt: skip
def test_the_operators_default_network(spec_network: Any, default: str | None, profile: str | None) -> None:
    s = spec(**({"network": spec_network} if spec_network else {}))
    got = with_defaults(s, NetworkSpec.parse(default or ""))
    assert (got.network.profile if got.network else None) == profile


@pytest.mark.parametrize(
    ("clique", "cd", "mnnvl"), [(CLIQUE_A, True, True), (CLIQUE_A, False, False), (None, False, False)]
)
def test_multi_node_nvlink_env_comes_with_the_imex_channel(clique: str | None, cd: bool, mnnvl: bool) -> None:
    pool = {"replicas": 1, "gpusPerReplica": 4}
    s = spec(topology={"kind": "GB200-NVL72"}, prefill=pool, decode=pool)
    t = _pod(s, clique=clique, cd=cd)
    assert (_env(t).get("NCCL_MNNVL_ENABLE") == "1") is mnnvl
    assert {"key": L.ARCH, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"} in t["spec"]["tolerations"]


@pytest.mark.parametrize(
    ("kind", "ep", "deep_gemm"), [("vllm", True, True), ("vllm", False, False), ("sglang", True, False)]
)
def test_wide_expert_parallel_env(kind: str, ep: bool, deep_gemm: bool) -> None:
    s = spec(
        engine={"kind": kind}, decode={"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": ep}
    )
    assert (_env(_pod(s)).get("VLLM_USE_DEEP_GEMM") == "1") is deep_gemm


def test_users_scheduling_is_added_to_the_operators() -> None:
    user_term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu-a"]}]}
    s = spec(
        topology={"kind": "GB200-NVL72"},
        prefill={"replicas": 1, "gpusPerReplica": 4},
        decode={"replicas": 1, "gpusPerReplica": 4},
        engine={"serviceAccountName": "models-reader"},
        scheduling={
            "nodeSelector": {"team": "llm", L.GPU_PRODUCT: "NVIDIA-H100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [user_term]}},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
            },
            "priorityClassName": "inference",
        },
    )
    assert s.decode is not None
    selector = {L.GPU_PRODUCT: "NVIDIA-GB200"}
    pod = pools.pod_template(PoolBuild(OWNER, s, "decode", IMG, selector, CLIQUE_A))["spec"]
    assert pod["nodeSelector"] == {"team": "llm", L.GPU_PRODUCT: "NVIDIA-GB200"}  # the topology's pin wins
    assert [t["key"] for t in pod["tolerations"]] == [L.GPU_RESOURCE, L.ARCH, "dedicated"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == ["pool", L.GPU_CLIQUE]  # ANDed with the clique pin
    assert "podAntiAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "inference"
    assert pod["serviceAccountName"] == "models-reader"
