"""Engine containers: the vLLM, SGLang or emulator command line, env, ports, probes and drain."""

from __future__ import annotations

import json
from typing import Any

from xpyd_api import labels as L
from xpyd_api.engines import EngineProfile
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator import engine_ranks, engines
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.engine_ranks import Rank

# The preStop drain: wait while the engine reports work (its own metric names, from the profile): running
# requests and, on a prefill pod, KV blocks in use, which covers those held until a decode worker has read
# them (a prefill engine that exits first fails that read). Any sample above zero keeps it waiting.
_DRAIN = (
    "sleep 5; i=0; while [ $i -lt {limit} ]; do "
    "n=$( (curl -s localhost:{port}/metrics || wget -qO- localhost:{port}/metrics) 2>/dev/null"
    " | grep -E '^({busy})[ {{]' | awk '$2 > 0 {{s=1}} END {{print s+0}}'); "
    '[ "${{n:-0}}" -eq 0 ] && exit 0; i=$((i+1)); sleep 1; done'
)


def drain_hook(spec: DisaggregatedDeploymentSpec, role: str) -> str:
    """The preStop command: what it waits on is the engine's running count, plus KV in use for prefill."""
    metrics = engines.profile_of(spec).metrics
    busy = [metrics.running, *(metrics.kv_usage if role == "prefill" else ())]
    return _DRAIN.format(limit=max(1, spec.engine.drain_seconds - 5), port=L.ENGINE_PORT, busy="|".join(busy))


# Every engine publishes its KV-cache events (ZMQ) on its pod IP; the router subscribes to the pod's
# kv-events/kv-replay ports (+ rank). The kind's renderer adds what its release reads besides these keys.
KV_EVENTS: dict[str, object] = {
    "publisher": "zmq", "endpoint": f"tcp://*:{L.KV_EVENTS_PORT}", "replay_endpoint": f"tcp://*:{L.KV_REPLAY_PORT}",
    "topic": L.KV_EVENTS_TOPIC,
}  # fmt: skip


def image_for(spec: DisaggregatedDeploymentSpec, own_image: str) -> str:
    if spec.engine.image:
        return spec.engine.image
    return own_image if engines.renderer(spec.engine.kind).own_image() else engines.default_image(spec.engine.kind)


def command(
    spec: DisaggregatedDeploymentSpec,
    role: str,
    pool: PoolSpec,
    rank: Rank | None = None,
    *,
    profile: EngineProfile | None = None,
) -> list[str]:
    """The full engine command line of one pool's containers; `rank` for a pod of a multi-node replica."""
    profile = profile or engines.profile_of(spec)
    kind = engines.renderer(spec.engine.kind)
    argv = kind.argv(spec, role, pool, profile)
    events = json.dumps(kind.kv_events_config(dict(KV_EVENTS)), separators=(",", ":"))
    tail = ["--kv-events-config", events, *spec.engine.args, *pool.args]
    if rank is None:
        return [*argv, *tail]
    return engine_ranks.shell([*argv, *kind.rank_flags(spec, role, pool, rank, profile), *tail])


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def env(spec: DisaggregatedDeploymentSpec, owner_name: str, role: str, domain: str | None) -> list[dict[str, Any]]:
    """Engine env: side-channel host from the pod IP, node and NVLink domain, then the user's."""
    out: list[dict[str, Any]] = [_field("POD_IP", "status.podIP")]
    if engines.profile_of(spec).handoff == "nixl":  # vLLM's NIXL side channel: where decode asks for the KV
        out += [_field(L.ENV_NIXL_HOST, "status.podIP"), {"name": L.ENV_NIXL_PORT, "value": str(L.NIXL_PORT)}]
    out += [
        _field(L.ENV_NODE_NAME, "spec.nodeName"),
        {"name": L.ENV_ROLE, "value": role},
        {"name": L.ENV_DEPLOYMENT, "value": owner_name},
    ]
    if engines.renderer(spec.engine.kind).own_image():  # the emulator binds its HTTP and rank-join ports here
        out.append(_field("XPYD_BIND_HOST", "status.podIP"))
        # and refuses a handoff from a worker of another engine revision, as vLLM refuses incompatible KV
        out.append(_field(L.ENV_ENGINE_REV, f"metadata.labels['{L.ENGINE_REV}']"))
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


def container(b: PoolBuild, rank: Rank | None = None) -> dict[str, Any]:
    """The engine container; a multi-node replica's non-leader ranks serve no API: no ports, no probes."""
    spec, role, pool = b.spec, b.role, b.pool
    if rank == "worker":
        return {
            "name": "engine",
            "image": image_for(spec, b.image),
            "command": command(spec, role, pool, rank),
            "env": env(spec, b.owner.name, role, b.clique),
            "resources": resources(spec, pool),
        }
    kind = engines.renderer(spec.engine.kind)
    ports = [{"name": "http", "containerPort": L.ENGINE_PORT, "protocol": "TCP"}, *kind.ports(role, rank)]
    ports.append({"name": L.KV_EVENTS_PORT_NAME, "containerPort": L.KV_EVENTS_PORT, "protocol": "TCP"})
    ports.append({"name": L.KV_REPLAY_PORT_NAME, "containerPort": L.KV_REPLAY_PORT, "protocol": "TCP"})
    health = {"httpGet": {"path": "/health", "port": "http"}}
    drain = drain_hook(spec, role)
    return {
        "name": "engine",
        "image": image_for(spec, b.image),
        "command": command(spec, role, pool, rank),
        "env": env(spec, b.owner.name, role, b.clique),
        "ports": ports,
        "resources": resources(spec, pool),
        # A busy engine answers /health late (its API server tokenizes and streams on one loop): the readiness
        # probe waits as long as the liveness one rather than the kubelet's 1 s, so load alone does not flap it.
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 180},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", drain]}}},
    }
