"""The router's Deployment, Service, ServiceAccount and the namespaced Role it reads the pools with."""

from __future__ import annotations

from typing import Any

from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator.meta import Owner, child_name, labels_for, metadata_for, selector

ROLE = "router"

# The router only reads its pools: pods (IP, readiness, node name, NVLink domain label) and
# endpointslices, in its own namespace; nothing cluster-scoped (no nodes).
RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]


def name(owner: Owner) -> str:
    return child_name(owner, ROLE)


def deployment(owner: Owner, spec: DisaggregatedDeploymentSpec, image: str) -> dict[str, Any]:
    cmd = ["xpyd", "router", "--deployment", owner.name, "--namespace", owner.namespace]
    cmd += ["--host", "$(POD_IP)", "--port", str(L.ROUTER_PORT), "--policy", spec.router.policy]
    cmd += ["--engine", "sglang" if spec.engine.kind == "sglang" else "vllm"]
    probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 5}
    container = {
        "name": "router",
        "image": spec.router.image or image,
        "command": cmd,
        "env": [
            {"name": L.ENV_ROUTER_POLICY, "value": spec.router.policy},
            {"name": L.ENV_DEPLOYMENT, "value": owner.name},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [{"name": "http", "containerPort": L.ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
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
                "spec": {"serviceAccountName": name(owner), "containers": [container]},
            },
        },
    }


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
