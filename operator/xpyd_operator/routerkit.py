"""The router's Deployment, Service, ServiceAccount and the namespaced Role it reads the pools with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from xpyd_api import labels as L
from xpyd_api.models import AUTO_TOKENIZER, HF_TOKEN, DisaggregatedDeploymentSpec, RouterServiceSpec, usable_tokenizer
from xpyd_operator import engines, podsecurity, sizing
from xpyd_operator.meta import Owner, child_name, labels_for, metadata_for, selector
from xpyd_perf import UnknownModelError, resolve_model

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
# Secrets mounted as files, not env: the kubelet updates a mounted Secret in place (no subPath), and the
# router re-reads the key file and the certificate when they change, so rotations need no restart.
KEY_VOLUME, KEY_DIR, KEY_FILE = "api-key", "/etc/xpyd/router-key", "api-key"
TLS_VOLUME, TLS_DIR = "tls", "/etc/xpyd/router-tls"


# How long the router holds a request while a pool at zero starts: an engine's cold start (image pulled,
# weights loaded, kernels compiled) takes minutes; the request's own deadline (600 s) bounds it too.
COLD_HOLD_SECONDS = 300.0


def scales_to_zero(spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether a pool may stand at zero replicas: asked so, or allowed to by its autoscaling bounds."""
    return any(
        pool.replicas == 0 or (pool.autoscaling is not None and pool.autoscaling.min_replicas == 0)
        for pool in spec.pools().values()
    )


def cpu_tier_args(spec: DisaggregatedDeploymentSpec) -> list[str]:
    """The hardware the router prices a reload from a first-hop pool's CPU tier by (its `tiers` scorer):
    none unless that pool offloads KV, the topology names its GPU and the catalog knows the model."""
    first = spec.prefill or spec.worker
    hardware = spec.topology.hardware
    if first is None or first.kv_offload is None or hardware is None:
        return []
    try:
        resolve_model(spec.model.name)
    except UnknownModelError:  # an inline or unknown model: the router could not price it by name
        return []
    return ["--cpu-tier-gpu", hardware.gpu.name, "--cpu-tier-model", spec.model.name,
            "--cpu-tier-tp", str(first.gpus_per_replica)]  # fmt: skip


def breakeven_seconds(spec: DisaggregatedDeploymentSpec) -> float:
    """The handoff a pair is held to: the decode stall that disaggregation saves (t_stall, for a
    workload.promptTokens prompt on the prefill pool's tensor parallel), as the DisaggregationWorthwhile
    condition prices it; 0 when there is no handoff or nothing to price it by (topology Any, an unknown model)."""
    if spec.prefill is None or spec.decode is None:
        return 0.0
    try:
        verdict = sizing.break_even_of(spec, spec.prefill)
    except ValueError:
        return 0.0
    return verdict.stall_seconds if verdict is not None else 0.0


def handoff_slow_args(spec: DisaggregatedDeploymentSpec) -> list[str]:
    """--handoff-slow-seconds: spec.router.handoffSlowSeconds, else the break-even (rounded up to the
    millisecond); none for 0, the trip off."""
    seconds = spec.router.handoff_slow_seconds
    if seconds is None:
        seconds = breakeven_seconds(spec)
    if seconds <= 0:
        return []
    return ["--handoff-slow-seconds", f"{math.ceil(seconds * 1000) / 1000:g}"]


def name(owner: Owner) -> str:
    return child_name(owner, ROLE)


def deployment(owner: Owner, spec: DisaggregatedDeploymentSpec, image: str) -> dict[str, Any]:
    cmd = ["xpyd", "router", "--deployment", owner.name, "--namespace", owner.namespace]
    cmd += ["--host", "$(POD_IP)", "--port", str(L.ROUTER_PORT), "--policy", spec.router.policy]
    if (kv_bytes := sizing.kv_bytes_per_token(spec)) is not None:  # the KV bytes each pair hands over
        cmd += ["--kv-bytes-per-token", str(kv_bytes)]
    cmd += ["--engine", spec.engine.kind]  # the router speaks the kind's handoff protocol (xpyd_api.engines)
    if (tok := tokenizer(spec)) != "none":  # prefixes keyed by the engines' tokens: their KV events apply
        cmd += ["--tokenizer", tok]
    cmd += secret_args(spec)
    cmd += cpu_tier_args(spec)
    cmd += handoff_slow_args(spec)  # a pair whose handoffs exceed the break-even cools off (xpyd_router.pairs)
    if scales_to_zero(spec):  # requests wait for a pool at zero to start, and their count wakes it
        cmd += ["--hold-seconds", f"{COLD_HOLD_SECONDS:g}", "--served-model", spec.model.name]
    if spec.router.log_level != "WARNING":  # the router's default: unchanged pods for unchanged specs
        cmd += ["--log-level", spec.router.log_level]
    # Ready once it routes (/health: a ready decode or co-located worker); alive while its loop answers.
    # With TLS the kubelet probes over HTTPS (it checks no certificate).
    get: dict[str, Any] = {"port": "http", **({"scheme": "HTTPS"} if spec.router.tls is not None else {})}
    ready = {"httpGet": {"path": "/health", **get}, "periodSeconds": 5, "timeoutSeconds": 3}
    alive = {"httpGet": {"path": "/metrics", **get}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "router",
        "image": spec.router.image or image,
        "command": cmd,
        "env": [
            {"name": L.ENV_ROUTER_POLICY, "value": spec.router.policy},
            {"name": L.ENV_DEPLOYMENT, "value": owner.name},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *hub_env(spec),
        ],
        "ports": [{"name": "http", "containerPort": L.ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": ready,
        "livenessProbe": {**alive, "failureThreshold": 6},
        "resources": {k: dict(v) for k, v in RESOURCES.items()},
        "securityContext": podsecurity.restricted_container_context(),
        "volumeMounts": [podsecurity.tmp_mount(), *secret_mounts(spec)],
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
        "volumes": [podsecurity.tmp_volume(), *secret_volumes(spec)],
        "topologySpreadConstraints": spread,
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(L.ROUTER_PORT),
        "prometheus.io/path": "/metrics",
    }
    if spec.router.tls is not None:
        annotations["prometheus.io/scheme"] = "https"
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


def secret_args(spec: DisaggregatedDeploymentSpec) -> list[str]:
    """--api-key-file and --tls-* at the mounted Secrets' files (never a secret on the command line)."""
    out: list[str] = []
    if spec.router.api_key_secret is not None:
        out += ["--api-key-file", f"{KEY_DIR}/{KEY_FILE}"]
    if spec.router.tls is not None:
        out += ["--tls-cert-file", f"{TLS_DIR}/tls.crt", "--tls-key-file", f"{TLS_DIR}/tls.key"]
        out += ["--tls-ca-file", f"{TLS_DIR}/ca.crt"]  # used when the Secret has one (cert-manager's CA issuers)
    return out


def secret_volumes(spec: DisaggregatedDeploymentSpec) -> list[dict[str, Any]]:
    """The API key's Secret (its one key, as a file) and the TLS Secret (all of it), read-only volumes."""
    out: list[dict[str, Any]] = []
    if (ref := spec.router.api_key_secret) is not None:
        items = [{"key": ref.key, "path": KEY_FILE}]
        out.append({"name": KEY_VOLUME, "secret": {"secretName": ref.name, "items": items}})
    if (tls := spec.router.tls) is not None:
        out.append({"name": TLS_VOLUME, "secret": {"secretName": tls.secret_name}})
    return out


def secret_mounts(spec: DisaggregatedDeploymentSpec) -> list[dict[str, Any]]:
    """Whole-directory mounts (a subPath mount would never see an update)."""
    out: list[dict[str, Any]] = []
    if spec.router.api_key_secret is not None:
        out.append({"name": KEY_VOLUME, "mountPath": KEY_DIR, "readOnly": True})
    if spec.router.tls is not None:
        out.append({"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True})
    return out


def tokenizer(spec: DisaggregatedDeploymentSpec) -> str:
    """The router's --tokenizer: the emulator's tokens, or the served model's tokenizer from the Hub.

    A model served from a path (a volume on the engines), or named so that it is no Hub repository,
    has none the router could fetch; name its tokenizer in spec.router.tokenizer (a path in the
    router image or another repository), else byte keys.
    """
    choice = spec.router.tokenizer
    if choice != AUTO_TOKENIZER:
        return choice
    if engines.profile_of(spec).tokens == "emulator":
        return "emulator"
    hub = f"hf:{spec.model.name}"
    return hub if usable_tokenizer(hub) else "none"


def rank_routing(spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether the router routes to each data-parallel rank (spec.router.dataParallelRouting): 'auto'
    only where the engine release is known to pin a request's rank by header (the profile's rank_header:
    vLLM v0.11-v0.13 read X-data-parallel-rank and drop it before the engine client, so pinned routes
    would go where its balancer sends them while the router's picture says otherwise)."""
    choice = spec.router.data_parallel_routing
    if choice != "auto":
        return choice == "ranks"
    return engines.profile_of(spec).rank_header


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


def service(owner: Owner, spec: DisaggregatedDeploymentSpec | None = None) -> dict[str, Any]:
    """The router's Service (spec.router.service). What the API server allocates (clusterIP, nodePort,
    healthCheckNodePort) is left out, so it keeps them across applies; annotations the spec drops go."""
    svc = spec.router.service if spec is not None else RouterServiceSpec()
    port = {"name": "http", "port": L.ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}
    meta = metadata_for(owner, name(owner), ROLE)
    if svc.annotations:
        meta["annotations"] = dict(svc.annotations)
    body: dict[str, Any] = {"type": svc.type, "selector": selector(owner, ROLE), "ports": [port]}
    if svc.load_balancer_class is not None:
        body["loadBalancerClass"] = svc.load_balancer_class
    if svc.external_traffic_policy is not None:
        body["externalTrafficPolicy"] = svc.external_traffic_policy
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}


@dataclass(frozen=True)
class MonitorSettings:
    """The operator's PodMonitors for routers that serve TLS (--router-pod-monitor): as the chart's own."""

    interval: str = "15s"
    labels: dict[str, str] = field(default_factory=dict)  # what the cluster's Prometheus selects monitors by


MONITOR_CA_KEY = "ca.crt"  # the TLS Secret's CA (cert-manager's CA issuers write it)


def server_name(owner: Owner) -> str:
    """The name a scrape checks the router's certificate for: its Service's in-cluster DNS name."""
    return f"{name(owner)}.{owner.namespace}.svc"


def pod_monitor(owner: Owner, spec: DisaggregatedDeploymentSpec, settings: MonitorSettings) -> dict[str, Any] | None:
    """A PodMonitor that scrapes this deployment's routers over HTTPS, or None when they serve plain HTTP (the
    chart's PodMonitor scrapes those, and drops pods annotated prometheus.io/scheme: https).

    Prometheus checks the certificate against the TLS Secret's ca.crt for the Service's name; /metrics
    needs no API key (the key guards the completion routes and the replicas' exchange only).
    """
    tls = spec.router.tls
    if tls is None:
        return None
    meta = metadata_for(owner, name(owner), ROLE)
    meta["labels"] = {**settings.labels, **meta["labels"]}
    endpoint = {
        "port": "http",
        "path": "/metrics",
        "scheme": "https",
        "interval": settings.interval,
        "tlsConfig": {
            "ca": {"secret": {"name": tls.secret_name, "key": MONITOR_CA_KEY}},
            "serverName": server_name(owner),
        },
        # The labels the autoscaler's and the dashboards' queries select on, as the chart's PodMonitor sets them.
        "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_label_xpyd_io_deployment"], "targetLabel": "xpyd_deployment"},
            {"sourceLabels": ["__meta_kubernetes_pod_label_xpyd_io_role"], "targetLabel": "xpyd_role"},
        ],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector(owner, ROLE)},
            "namespaceSelector": {"matchNames": [owner.namespace]},
            "podMetricsEndpoints": [endpoint],
        },
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
