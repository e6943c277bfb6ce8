"""The router's way in: its Service (type, annotations), TLS, the API key as a file, the log level."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]
from pydantic import ValidationError

from xpyd_api import labels as L
from xpyd_operator import routerkit
from xpyd_operator.desired import build_children
from xpyd_operator.placement import Demand, place

IMG = "ghcr.io/xpyd/xpyd:test"
KEY = {"apiKeySecret": {"name": "router-key", "key": "s3cr3t-key"}}
TLS = {"tls": {"secretName": "router-cert"}}
KEY_VOLUME = {
    "name": "api-key",
    "secret": {"secretName": "router-key", "items": [{"key": "s3cr3t-key", "path": "api-key"}]},
}
TLS_VOLUME = {"name": "tls", "secret": {"secretName": "router-cert"}}
KEY_MOUNT = {"name": "api-key", "mountPath": "/etc/xpyd/router-key", "readOnly": True}
TLS_MOUNT = {"name": "tls", "mountPath": "/etc/xpyd/router-tls", "readOnly": True}
KEY_ARGS = ["--api-key-file", "/etc/xpyd/router-key/api-key"]
TLS_ARGS = [
    "--tls-cert-file", "/etc/xpyd/router-tls/tls.crt", "--tls-key-file", "/etc/xpyd/router-tls/tls.key",
    "--tls-ca-file", "/etc/xpyd/router-tls/ca.crt",
]  # fmt: skip


def pod(router: dict[str, Any]) -> dict[str, Any]:
    dep = routerkit.deployment(OWNER, spec(router=router), IMG)
    out: dict[str, Any] = dep["spec"]["template"]
    return out


def tail(cmd: list[str]) -> list[str]:
    """The command after --tokenizer's pair (what the secrets and the log level add), without the break-even's
    pair (--handoff-slow-seconds, tests/operator/test_op_router_breakeven.py)."""
    out = cmd[cmd.index("--tokenizer") + 2 :]
    if "--handoff-slow-seconds" in out:
        at = out.index("--handoff-slow-seconds")
        del out[at : at + 2]
    return out


@pytest.mark.parametrize(
    ("router", "args", "volumes", "mounts", "scheme"),
    [
        ({}, [], [], [], None),
        (KEY, KEY_ARGS, [KEY_VOLUME], [KEY_MOUNT], None),
        (TLS, TLS_ARGS, [TLS_VOLUME], [TLS_MOUNT], "HTTPS"),
        ({**KEY, **TLS}, KEY_ARGS + TLS_ARGS, [KEY_VOLUME, TLS_VOLUME], [KEY_MOUNT, TLS_MOUNT], "HTTPS"),
        ({"logLevel": "DEBUG"}, ["--log-level", "DEBUG"], [], [], None),
        ({"logLevel": "WARNING"}, [], [], [], None),  # the router's default: the pod spec stays as it was
    ],
)
def test_router_secrets_are_mounted_files(
    router: dict[str, Any], args: list[str], volumes: list[Any], mounts: list[Any], scheme: str | None
) -> None:
    template = pod(router)
    c = template["spec"]["containers"][0]
    assert tail(c["command"]) == args
    assert template["spec"]["volumes"][1:] == volumes
    assert c["volumeMounts"][1:] == mounts
    assert all("subPath" not in m for m in c["volumeMounts"])  # a subPath mount never sees a Secret's update
    assert L.ENV_ROUTER_API_KEY not in {e["name"] for e in c["env"]}  # an env var never changes in a pod
    assert "s3cr3t" not in json.dumps(c["command"])  # never a literal on the command line
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["httpGet"].get("scheme") == scheme
    assert template["metadata"]["annotations"].get("prometheus.io/scheme") == ("https" if scheme else None)


@pytest.mark.parametrize(
    ("service", "want", "annotations"),
    [
        ({}, {"type": "ClusterIP"}, None),
        ({"type": "NodePort"}, {"type": "NodePort"}, None),
        (
            {
                "type": "LoadBalancer",
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"},
            },
            {"type": "LoadBalancer"},
            {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"},
        ),
        (
            {"type": "LoadBalancer", "loadBalancerClass": "example.com/lb", "externalTrafficPolicy": "Local"},
            {"type": "LoadBalancer", "loadBalancerClass": "example.com/lb", "externalTrafficPolicy": "Local"},
            None,
        ),
        (
            {"type": "NodePort", "externalTrafficPolicy": "Cluster"},
            {"type": "NodePort", "externalTrafficPolicy": "Cluster"},
            None,
        ),
    ],
)
def test_router_service_follows_the_spec(
    service: dict[str, Any], want: dict[str, Any], annotations: dict[str, str] | None
) -> None:
    svc = routerkit.service(OWNER, spec(router={"service": service}))
    body = svc["spec"]
    assert {k: v for k, v in body.items() if k not in ("selector", "ports")} == want
    assert body["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert svc["metadata"].get("annotations") == annotations
    # what the API server allocates is never in the manifest, so re-applies keep it
    assert not {"clusterIP", "clusterIPs", "healthCheckNodePort"} & set(body)
    assert all("nodePort" not in p for p in body["ports"])


def test_the_desired_service_is_the_specs() -> None:
    s = spec(router={"service": {"type": "LoadBalancer"}})
    demands = [Demand(role, p.replicas or 1, p.gpus_per_replica, p.tp) for role, p in s.pools().items()]
    children = build_children(OWNER, s, place(s.topology.hardware, demands), False, IMG, IMG)
    services = [c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == "llama-router"]
    assert [svc["spec"]["type"] for svc in services] == ["LoadBalancer"]


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ({"service": {"type": "ClusterIP", "loadBalancerClass": "x"}}, "needs type LoadBalancer"),
        ({"service": {"type": "NodePort", "loadBalancerClass": "x"}}, "needs type LoadBalancer"),
        ({"service": {"externalTrafficPolicy": "Local"}}, "needs type NodePort or LoadBalancer"),
        ({"service": {"type": "External"}}, "type"),
        ({"logLevel": "TRACE"}, "logLevel"),
        ({"tls": {}}, "secretName"),
    ],
)
def test_router_access_rejects_what_the_cluster_would(router: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(router=router)
