"""`xpyd render` of each reference example gives pods carrying what the public references agree a real
engine needs (the reference deployments' checklist): one row per feature, checked on every engine pod."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api import labels as L
from xpyd_cli.main import main as xpyd

REPO = Path(__file__).resolve().parents[2]
Pod = dict[str, Any]


@dataclass(frozen=True)
class Reference:
    """What the public deployment an example reproduces carries, where it differs between examples."""

    source: str
    rdma: str | None  # the device resource of the example's network profile
    env: dict[str, str] = field(default_factory=dict)  # per-topology and fabric environment
    startup_seconds: int = 0  # the reference's startup budget (period x failureThreshold)
    gb200: bool = False  # arm64 trays with a ComputeDomain channel
    expert_parallel: bool = False


SOCKETS = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
REFERENCES = {
    # llm-d pd-disaggregation ms-pd values.yaml (L-MS): rdma/ib 1, startup /v1/models 30 s x 60.
    "llama-70b-hgx-b200.yaml": Reference("L-MS", "rdma/ib", SOCKETS, 30 * 60),
    # llm-d wide-ep-lws gpu/vllm/base/{prefill,decode}.yaml (L-W): startup /health 1 s x 2700, DeepGEMM,
    # NCCL/Gloo/NVSHMEM sockets on eth0.
    "deepseek-r1-wide-ep-hgx-b200.yaml": Reference(
        "L-W", "rdma/ib", {**SOCKETS, "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "eth0", "VLLM_USE_DEEP_GEMM": "1",
                           "VLLM_RANDOMIZE_DP_DUMMY_INPUTS": "1"}, 1 * 2700, expert_parallel=True,
    ),
    # Dynamo recipes/deepseek-r1/vllm/disagg/deploy_gb200_2prefill_dep4_1decode_dep8.yaml (D-GB): the MNNVL
    # env, a ComputeDomain claim, startup 10 s x 600; arm64 from llm-d gke-a4x (L-A4X).
    "deepseek-r1-gb200-nvl72.yaml": Reference(
        "D-GB", None, {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}, 10 * 600,
        gb200=True, expert_parallel=True,
    ),
}  # fmt: skip


def render(name: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert xpyd(["render", str(REPO / "examples" / name)]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def _engine(pod: Pod) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == "engine")


def _env(pod: Pod) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _engine(pod)["env"]}


def _argv(pod: Pod) -> list[str]:
    """The engine's command line; a multi-node rank's `/bin/sh -c 'exec ...'` split as the shell would."""
    argv: list[str] = _engine(pod)["command"]
    if argv[:2] == ["/bin/sh", "-c"]:
        return shlex.split(argv[2])[1:]
    return argv


def _serves_api(pod: Pod) -> bool:
    """The API pod of a replica: a StatefulSet's, or a LeaderWorkerSet group's leader (the others are headless)."""
    return "--headless" not in _argv(pod)


def _flag(argv: list[str], name: str, default: str) -> str:
    for i, token in enumerate(argv):
        if token == name:
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return default


def _volume(pod: Pod, mount_path: str) -> dict[str, Any]:
    (mount,) = [m for m in _engine(pod)["volumeMounts"] if m["mountPath"] == mount_path]
    return next(v for v in pod["volumes"] if v["name"] == mount["name"])


def gpus_equal_world_size(pod: Pod, ref: Reference) -> None:  # all references: nvidia.com/gpu = TP x DP_local
    c = _engine(pod)
    argv = _argv(pod)
    local = _flag(argv, "--data-parallel-size-local", _flag(argv, "--data-parallel-size", "1"))
    world = int(_flag(argv, "--tensor-parallel-size", "1")) * int(local)
    assert c["resources"]["requests"][L.GPU_RESOURCE] == c["resources"]["limits"][L.GPU_RESOURCE] == str(world)
    assert ("--enable-expert-parallel" in argv) is ref.expert_parallel


def memory_backed_shm(pod: Pod, ref: Reference) -> None:  # all: 2Gi (L-W) ... 800Gi (D-GB), Dynamo 8Gi
    shm = _volume(pod, "/dev/shm")["emptyDir"]
    assert shm["medium"] == "Memory"
    assert int(shm["sizeLimit"].removesuffix("Gi")) >= 8


def token_from_a_secret(pod: Pod, ref: Reference) -> None:  # L-PD, L-SGL, D-L70, production-stack
    token = next(e for e in _engine(pod)["env"] if e["name"] == "HF_TOKEN")
    assert "value" not in token
    assert set(token["valueFrom"]["secretKeyRef"]) == {"name", "key"}


def model_cache_volume(pod: Pod, ref: Reference) -> None:  # L-*, Dynamo (PVC /model-cache), RBG
    home = _env(pod)["HF_HOME"]
    assert _volume(pod, home)["persistentVolumeClaim"]["claimName"] == "model-cache"


def rdma_resource_and_capability(pod: Pod, ref: Reference) -> None:  # L-MS, D-ADD, RBG; IPC_LOCK: L-W, L-SGL
    c = _engine(pod)
    if ref.rdma is None:  # the KV handoff stays on multi-node NVLink (D-GB requests no RDMA device)
        assert not any(r.startswith("rdma/") for r in c["resources"]["requests"])
        return
    assert c["resources"]["requests"][ref.rdma] == c["resources"]["limits"][ref.rdma]
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


def side_channel_host(pod: Pod, ref: Reference) -> None:  # L-W, L-PD, L-MS; NixlConnector: all
    c = _engine(pod)
    assert _env(pod)[L.ENV_NIXL_HOST] == {"fieldRef": {"fieldPath": "status.podIP"}}
    if _serves_api(pod):
        assert {"name": "kv-side", "containerPort": L.NIXL_PORT, "protocol": "TCP"} in c["ports"]
    config = json.loads(_flag(_argv(pod), "--kv-transfer-config", "{}"))
    if config.get("kv_connector") == "MultiConnector":  # a pool with kvOffload: the handoff first, the CPU tier next
        connectors = config["kv_connector_extra_config"]["connectors"]
        assert [c["kv_connector"] for c in connectors][1:] == ["OffloadingConnector"], connectors
        assert connectors[0]["kv_role"] == config["kv_role"], connectors
        config = connectors[0]
    # the references' kv_both is deprecated from vLLM 0.23: producer on prefill, consumer on decode (docs/engines.md)
    assert config["kv_connector"] == "NixlConnector" and config["kv_role"] in ("kv_producer", "kv_consumer")


def topology_environment(pod: Pod, ref: Reference) -> None:  # sockets: L-W, L-SGL; MNNVL: D-GB; arm64: L-A4X
    env = _env(pod)
    assert {k: env.get(k) for k in ref.env} == ref.env
    arm64 = {"key": L.ARCH, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}
    assert (arm64 in pod["tolerations"]) is ref.gb200
    if ref.gb200:  # the ComputeDomain's IMEX channel: a pod claim and the container's
        (claim,) = pod["resourceClaims"]
        assert claim["resourceClaimTemplateName"].endswith("-imex-channel")
        assert _engine(pod)["resources"]["claims"] == [{"name": claim["name"]}]


def probes_sized_for_a_large_model(pod: Pod, ref: Reference) -> None:  # L-W 1 s x 2700, D-GB 10 s x 600
    c = _engine(pod)
    if not _serves_api(pod):  # a headless rank: its group's leader fails its probes when it dies
        assert "startupProbe" not in c and "livenessProbe" not in c
        return
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= ref.startup_seconds
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


FEATURES: list[Callable[[Pod, Reference], None]] = [
    gpus_equal_world_size,
    memory_backed_shm,
    token_from_a_secret,
    model_cache_volume,
    rdma_resource_and_capability,
    side_channel_host,
    topology_environment,
    probes_sized_for_a_large_model,
]


@pytest.mark.parametrize("example", sorted(REFERENCES))
@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: f.__name__)
def test_rendered_engine_pods_carry_what_the_reference_needs(
    example: str, feature: Callable[[Pod, Reference], None], capsys: pytest.CaptureFixture[str]
) -> None:
    ref = REFERENCES[example]
    workloads = [o for o in render(example, capsys) if o["kind"] in ("StatefulSet", "LeaderWorkerSet")]
    assert len(workloads) == 2, f"{example} ({ref.source}): a prefill and a decode pool"
    pods = [t["spec"] for w in workloads for t in _templates(w)]
    assert len(pods) == 2 + sum(w["kind"] == "LeaderWorkerSet" for w in workloads)
    for pod in pods:
        feature(pod, ref)


def _templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "StatefulSet":
        return [workload["spec"]["template"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


@pytest.mark.parametrize("example", sorted(REFERENCES))
def test_render_prints_every_child_the_operator_applies(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    kinds = sorted(o["kind"] for o in render(example, capsys))
    pools = ["LeaderWorkerSet"] * 2 if REFERENCES[example].expert_parallel else ["StatefulSet"] * 2  # 2 nodes each
    want = sorted(["Deployment", "PodDisruptionBudget", "PodDisruptionBudget", "PodDisruptionBudget", "Role",
                   "RoleBinding", "Service", "Service", "Service", "ServiceAccount", *pools])  # fmt: skip
    if REFERENCES[example].gb200:
        want = sorted([*want, "ComputeDomain"])
    assert kinds == want
