"""Engine containers: the vLLM, SGLang or emulator command line, env, ports, probes and drain."""

from __future__ import annotations

import json
from typing import Any

from xpyd_api import fabrics
from xpyd_api import labels as L
from xpyd_api import metric_names as names
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator import engine_ranks
from xpyd_operator.engine_ranks import Rank, Word

DEFAULT_IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:v0.5.3"}
_DRAIN = (
    "sleep 5; i=0; while [ $i -lt {limit} ]; do "
    "n=$( (curl -s localhost:{port}/metrics || wget -qO- localhost:{port}/metrics) 2>/dev/null"
    " | grep -E '^" + names.RUNNING + "' | awk '{{s+=$2}} END {{print int(s)}}'); "
    '[ "${{n:-0}}" -eq 0 ] && exit 0; i=$((i+1)); sleep 1; done'
)


# Every engine publishes its KV-cache events (ZMQ, vLLM's format; SGLang reads the same JSON and ignores
# the enable key) on its pod IP; the router subscribes to the pod's kv-events/kv-replay ports.
KV_EVENTS_CONFIG = json.dumps(
    {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{L.KV_EVENTS_PORT}",
     "replay_endpoint": f"tcp://*:{L.KV_REPLAY_PORT}", "topic": L.KV_EVENTS_TOPIC},
    separators=(",", ":"),
)  # fmt: skip


def image_for(spec: DisaggregatedDeploymentSpec, own_image: str) -> str:
    if spec.engine.image:
        return spec.engine.image
    return own_image if spec.engine.kind == "emulator" else DEFAULT_IMAGES[spec.engine.kind]


def nixl_backends(spec: DisaggregatedDeploymentSpec) -> tuple[str, ...]:
    """NIXL transports the network profile needs besides UCX's default (LIBFABRIC on AWS EFA)."""
    if spec.network is None or spec.engine.kv_connector != "NixlConnector":
        return ()
    return fabrics.PROFILES[spec.network.profile].parts(1).nixl_backends


def _vllm_argv(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec) -> list[str]:
    argv = ["vllm", "serve", spec.model.name, "--port", str(L.ENGINE_PORT)]
    argv += ["--tensor-parallel-size", str(pool.tp)]
    if pool.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(pool.pipeline_parallel_size)]
    if pool.data_parallel_size > 1:
        argv += ["--data-parallel-size", str(pool.data_parallel_size)]
    if pool.expert_parallel:
        argv += ["--enable-expert-parallel"]
    if role == "worker":
        argv += ["--enable-chunked-prefill"]
    else:
        config: dict[str, object] = {"kv_connector": spec.engine.kv_connector, "kv_role": "kv_both"}
        if backends := nixl_backends(spec):
            config["kv_connector_extra_config"] = {"backends": list(backends)}
        argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    return argv


def _sglang_argv(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec) -> list[str]:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", spec.model.name]
    argv += ["--host", "0.0.0.0", "--port", str(L.ENGINE_PORT)]
    argv += ["--tp-size", str(pool.tp * pool.data_parallel_size)]  # spans the data-parallel attention ranks
    if pool.pipeline_parallel_size > 1:
        argv += ["--pp-size", str(pool.pipeline_parallel_size)]
    if pool.data_parallel_size > 1:  # SGLang's --tp is the world size; data-parallel attention splits it
        argv += ["--dp-size", str(pool.data_parallel_size), "--enable-dp-attention"]
    if pool.expert_parallel:
        argv += ["--ep-size", str(pool.tp * pool.data_parallel_size)]
    if role == "worker":
        return [*argv, "--enable-mixed-chunk"]
    backend = "nixl" if spec.engine.kv_connector == "NixlConnector" else "mooncake"
    argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", backend]
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(L.SGLANG_BOOTSTRAP_PORT)]
    return argv


def command(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, rank: Rank | None = None) -> list[str]:
    """The full engine command line of one pool's containers; `rank` for a pod of a multi-node replica."""
    layout = pool.layout(spec.topology.hardware)
    group: list[Word] = []
    if spec.engine.kind == "sglang":
        argv = _sglang_argv(spec, role, pool)
        if rank is not None:
            group = engine_ranks.sglang_flags(layout, role)
    else:
        argv = _vllm_argv(spec, role, pool)
        if rank is not None:
            group = engine_ranks.vllm_flags(layout, rank)
        if spec.engine.kind == "emulator":
            argv = ["xpyd", "emulate", "--", *argv]
    tail = ["--kv-events-config", KV_EVENTS_CONFIG, *spec.engine.args, *pool.args]
    if rank is None:
        return [*argv, *tail]
    return engine_ranks.shell([*argv, *group, *tail])


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def env(spec: DisaggregatedDeploymentSpec, owner_name: str, role: str, domain: str | None) -> list[dict[str, Any]]:
    """Engine env: side-channel host from the pod IP, node and NVLink domain, then the user's."""
    out: list[dict[str, Any]] = [
        _field("POD_IP", "status.podIP"),
        _field(L.ENV_NIXL_HOST, "status.podIP"),
        {"name": L.ENV_NIXL_PORT, "value": str(L.NIXL_PORT)},
        _field(L.ENV_NODE_NAME, "spec.nodeName"),
        {"name": L.ENV_ROLE, "value": role},
        {"name": L.ENV_DEPLOYMENT, "value": owner_name},
    ]
    if spec.engine.kind == "emulator":  # the emulator binds its HTTP and rank-join ports to this address
        out.append(_field("XPYD_BIND_HOST", "status.podIP"))
    topology = spec.topology.hardware
    if domain is not None:
        out.append({"name": L.ENV_NVLINK_DOMAIN, "value": domain})
    elif topology is not None and topology.nvlink_domain == "node":
        out.append(_field(L.ENV_NVLINK_DOMAIN, "spec.nodeName"))
    if topology is not None:
        out.append({"name": L.ENV_GPU, "value": topology.gpu.name})
    out += [e.manifest() for e in spec.engine.env]
    return out


def needs_limit(resource: str) -> bool:
    """Extended resources (a domain outside kubernetes.io: nvidia.com/gpu, rdma/ib, ...) and hugepages
    cannot be overcommitted: the API server rejects a request without an equal limit."""
    domain, _, _ = resource.rpartition("/")
    native = not domain or domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    return resource.startswith("hugepages-") or not native


def resources(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> dict[str, Any]:
    """Requests and limits of one engine pod: a multi-node replica's pod takes one node's share of its GPUs."""
    requests: dict[str, str] = dict(spec.engine.resources)
    limits: dict[str, str] = {k: v for k, v in requests.items() if needs_limit(k)}
    gpus = pool.layout(spec.topology.hardware).gpus_per_pod
    if gpus > 0:
        requests[L.GPU_RESOURCE] = limits[L.GPU_RESOURCE] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def container(
    spec: DisaggregatedDeploymentSpec,
    owner_name: str,
    role: str,
    pool: PoolSpec,
    domain: str | None,
    own_image: str,
    rank: Rank | None = None,
) -> dict[str, Any]:
    """The engine container; a multi-node replica's non-leader ranks serve no API: no ports, no probes."""
    if rank == "worker":
        return {
            "name": "engine",
            "image": image_for(spec, own_image),
            "command": command(spec, role, pool, rank),
            "env": env(spec, owner_name, role, domain),
            "resources": resources(spec, pool),
        }
    ports = [{"name": "http", "containerPort": L.ENGINE_PORT, "protocol": "TCP"}]
    if role != "worker":
        ports.append({"name": "kv-side", "containerPort": L.NIXL_PORT, "protocol": "TCP"})
    if spec.engine.kind == "sglang" and role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": L.SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"})
    ports.append({"name": L.KV_EVENTS_PORT_NAME, "containerPort": L.KV_EVENTS_PORT, "protocol": "TCP"})
    ports.append({"name": L.KV_REPLAY_PORT_NAME, "containerPort": L.KV_REPLAY_PORT, "protocol": "TCP"})
    if rank == "leader":  # where the group's other ranks join the leader
        port = L.SGLANG_DIST_PORT if spec.engine.kind == "sglang" else L.DP_RPC_PORT
        ports.append({"name": "rank-join", "containerPort": port, "protocol": "TCP"})
    health = {"httpGet": {"path": "/health", "port": "http"}}
    drain = _DRAIN.format(limit=max(1, spec.engine.drain_seconds - 5), port=L.ENGINE_PORT)
    return {
        "name": "engine",
        "image": image_for(spec, own_image),
        "command": command(spec, role, pool, rank),
        "env": env(spec, owner_name, role, domain),
        "ports": ports,
        "resources": resources(spec, pool),
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 180},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", drain]}}},
    }
