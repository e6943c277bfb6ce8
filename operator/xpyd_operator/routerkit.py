"""The router's Deployment, Service, ServiceAccount and the namespaced Role it reads the pools with."""

from __future__ import annotations

import re
from typing import Any

from xpyd_api import labels as L
from xpyd_api.models import AUTO_TOKENIZER, HF_TOKEN, DisaggregatedDeploymentSpec, usable_tokenizer
from xpyd_operator import podsecurity
from xpyd_operator.meta import Owner, child_name, labels_for, metadata_for, selector

ROLE = "router"

# The router only reads its pools: pods (IP, readiness, node name, NVLink domain label) and
# endpointslices, in its own namespace; nothing cluster-scoped (no nodes).
RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]


# Requests for the scheduler; limits for namespaces whose quota demands them. The router is one asyncio
# process, so a CPU limit of 2 never throttles it; memory covers the prefix index and buffered bodies.
RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "500m", "memory": "256Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
HUB_CACHE = f"{podsecurity.TMP_PATH}/hf"  # HF_HOME: the router's only writable place is its /tmp emptyDir
HUB_ENV = ("HF_ENDPOINT", HF_TOKEN, "HF_HUB_OFFLINE", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
# Spread replicas over nodes, softly: a one-node cluster still schedules them all.
SPREAD_KEYS = (L.HOSTNAME,)


def name(owner: Owner) -> str:
    return child_name(owner, ROLE)


def deployment(owner: Owner, spec: DisaggregatedDeploymentSpec, image: str) -> dict[str, Any]:
    cmd = ["xpyd", "router", "--deployment", owner.name, "--namespace", owner.namespace]
    cmd += ["--host", "$(POD_IP)", "--port", str(L.ROUTER_PORT), "--policy", spec.router.policy]
    cmd += ["--engine", "sglang" if spec.engine.kind == "sglang" else "vllm"]
    if (tok := tokenizer(spec)) != "none":  # prefixes keyed by the engines' tokens: their KV events apply
        cmd += ["--tokenizer", tok]
    # Ready once it routes (/health: a ready decode or co-located worker); alive while its loop answers.
    ready = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 3}
    alive = {"httpGet": {"path": "/metrics", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "router",
        "image": spec.router.image or image,
        "command": cmd,
        "env": [
            {"name": L.ENV_ROUTER_POLICY, "value": spec.router.policy},
            {"name": L.ENV_DEPLOYMENT, "value": owner.name},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *api_key_env(spec),
            *hub_env(spec),
        ],
        "ports": [{"name": "http", "containerPort": L.ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": ready,
        "livenessProbe": {**alive, "failureThreshold": 6},
        "resources": {k: dict(v) for k, v in RESOURCES.items()},
        "securityContext": podsecurity.restricted_container_context(),
        "volumeMounts": [podsecurity.tmp_mount()],
    }
    mine = {"matchLabels": selector(owner, ROLE)}
    spread = [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": mine}
        for key in SPREAD_KEYS
    ]
    pod = {
        "serviceAccountName": name(owner),
        "securityContext": podsecurity.restricted_pod_context(),
        "containers": [container],
        "volumes": [podsecurity.tmp_volume()],
        "topologySpreadConstraints": spread,
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(L.ROUTER_PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata_for(owner, name(owner), ROLE),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector(owner, ROLE)},
            "template": {
                "metadata": {"labels": labels_for(owner, ROLE), "annotations": annotations},
                "spec": pod,
            },
        },
    }


def api_key_env(spec: DisaggregatedDeploymentSpec) -> list[dict[str, Any]]:
    """The router's API key from the user's Secret (never a literal in the pod spec), if one is asked for."""
    ref = spec.router.api_key_secret
    if ref is None:
        return []
    return [ref.env(L.ENV_ROUTER_API_KEY)]


def tokenizer(spec: DisaggregatedDeploymentSpec) -> str:
    """The router's --tokenizer: the emulator's tokens, or the served model's tokenizer from the Hub.

    A model served from a path (a volume on the engines), or named so that it is no Hub repository,
    has none the router could fetch; name its tokenizer in spec.router.tokenizer (a path in the
    router image or another repository), else byte keys.
    """
    choice = spec.router.tokenizer
    if choice != AUTO_TOKENIZER:
        return choice
    if spec.engine.kind == "emulator":
        return "emulator"
    hub = f"hf:{spec.model.name}"
    return hub if usable_tokenizer(hub) else "none"


RANK_HEADER_VLLM = (0, 14, 0)  # the first vLLM that passes X-data-parallel-rank on to its engines
_VERSION_TAG = re.compile(r":v?(\d+)\.(\d+)\.(\d+)(?:[-+.][\w.+-]*)?$")


def image_version(image: str) -> tuple[int, int, int] | None:
    """The semantic version in an image reference's tag (`vllm/vllm-openai:v0.14.1`), None without one."""
    match = _VERSION_TAG.search(image.split("@", 1)[0])
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def rank_routing(spec: DisaggregatedDeploymentSpec, engine_image: str) -> bool:
    """Whether the router routes to each data-parallel rank (spec.router.dataParallelRouting): 'auto'
    only where the engine is known to pin a request's rank by header. vLLM v0.11-v0.13 read
    X-data-parallel-rank and drop it before the engine client (serving_engine._process_inputs), so
    pinned routes would go where its balancer sends them while the router's picture says otherwise."""
    choice = spec.router.data_parallel_routing
    if choice != "auto":
        return choice == "ranks"
    if spec.engine.kind == "emulator":
        return True
    version = image_version(engine_image)
    return spec.engine.kind == "vllm" and version is not None and version >= RANK_HEADER_VLLM


def hub_env(spec: DisaggregatedDeploymentSpec) -> list[dict[str, Any]]:
    """What the router needs to fetch a tokenizer from the Hub: the engines' token and mirror, a cache in /tmp."""
    if not tokenizer(spec).startswith("hf:"):
        return []
    out: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HUB_CACHE}]
    if (ref := spec.model.token_secret) is not None:
        out.append(ref.env(HF_TOKEN))
    for var in spec.engine.env:  # a mirror or offline switch the engines use applies to the router too
        if var.name in HUB_ENV:
            out.append(var.manifest())
    return out


def service(owner: Owner) -> dict[str, Any]:
    port = {"name": "http", "port": L.ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata_for(owner, name(owner), ROLE),
        "spec": {"type": "ClusterIP", "selector": selector(owner, ROLE), "ports": [port]},
    }


def service_account(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata_for(owner, name(owner), ROLE)}


def role(owner: Owner) -> dict[str, Any]:
    meta = metadata_for(owner, name(owner), ROLE)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": RULES}


def role_binding(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata_for(owner, name(owner), ROLE),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name(owner)},
        "subjects": [{"kind": "ServiceAccount", "name": name(owner), "namespace": owner.namespace}],
    }


def disruption_budget(owner: Owner, spec: DisaggregatedDeploymentSpec) -> dict[str, Any] | None:
    """At most one router down at a time during node drains; none for a single router (it would block drains)."""
    if spec.router.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata_for(owner, name(owner), ROLE),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(owner, ROLE)}},
    }
