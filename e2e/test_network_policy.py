"""spec.networkPolicy against a real API server: the operator creates, updates and prunes the policies, and
requests still flow through the router with them applied.

The local cluster enforces no NetworkPolicy (its network is loopback addresses, no CNI), so this checks the
objects and that nothing the operator does with them breaks serving; the rules themselves are tested as
tables against the rendered pods in tests/operator/test_op_netpolicy.py.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from lightkube.resources.networking_v1 import NetworkPolicy

from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import netpolicy
from xpyd_operator.meta import Owner

from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube, op_namespace, operator_proc, dd)
from .operator_fixtures import Kube, dd_manifest, pods_of, role_of, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NAME = "fenced"
ROLES = ("router", "prefill", "decode")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EMULATED: dict[str, Any] = {"engine": {"kind": "emulator"}, "router": {"replicas": 2}}


def _policies(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    found = [dict(p.to_dict()) for p in kube.client.list(NetworkPolicy, namespace=ns, labels={L.DEPLOYMENT: NAME})]
    return {str(p["metadata"]["name"]): p for p in found}


def _expected(ns: str, uid: str, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    body = dd_manifest(NAME, ns, **EMULATED, networkPolicy=settings)["spec"]
    spec = DisaggregatedDeploymentSpec.model_validate(body)
    return {p["metadata"]["name"]: p for p in netpolicy.policies(Owner(NAME, ns, uid), spec)}


def _plain(value: Any) -> Any:
    """A selector as the API server returns it: an empty matchLabels may come back as no key at all."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not (k == "matchLabels" and v == {})}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _same_rules(have: dict[str, Any], want: dict[str, Any]) -> bool:
    """The API server's copy carries what the builder wrote."""
    return all(_plain(have["spec"].get(k)) == _plain(v) for k, v in want["spec"].items())


def _ready(kube: Kube, ns: str) -> dict[str, Any] | None:
    cond = kube.condition(ns, NAME, "Ready")
    return cond if cond and cond["status"] == "True" else None


def test_policies_are_children_and_requests_still_flow(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    settings: dict[str, Any] = {"enabled": True}
    uid = dd(NAME, **EMULATED, networkPolicy=settings)["metadata"]["uid"]
    want = _expected(op_namespace, uid, settings)
    assert set(want) == {f"{NAME}-{r}" for r in ROLES}

    def applied() -> dict[str, dict[str, Any]] | None:
        have = _policies(op_kube, op_namespace)
        return have if set(have) == set(want) else None

    have = wait_for(applied, 60, what="one NetworkPolicy per role")
    for name, policy in have.items():
        assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
        assert _same_rules(policy, want[name]), name
    router_rules = have[f"{NAME}-router"]["spec"]
    assert router_rules["podSelector"] == {"matchLabels": {L.DEPLOYMENT: NAME, L.ROLE: "router"}}
    assert {"protocol": "TCP", "port": L.ROUTER_PORT} in router_rules["ingress"][0]["ports"]
    decode_in = [p for r in have[f"{NAME}-decode"]["spec"]["ingress"] for p in r["ports"]]
    assert {"protocol": "TCP", "port": L.KV_EVENTS_PORT} in decode_in
    prefill_in = [p for r in have[f"{NAME}-prefill"]["spec"]["ingress"] for p in r["ports"]]
    assert {"protocol": "TCP", "port": L.NIXL_PORT} in prefill_in

    wait_for(lambda: _ready(op_kube, op_namespace), 180, interval=1, what="Ready=True with the policies")
    routers = [p for p in pods_of(op_kube, op_namespace, NAME) if role_of(p) == "router"]
    assert routers
    body = {"model": MODEL, "prompt": "hello through the fence", "max_tokens": 4}
    for pod in routers:
        reply = httpx.post(f"http://{pod.status.podIP}:{L.ROUTER_PORT}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"]

    # Narrowing the clients updates the router's policy in place.
    narrowed: dict[str, Any] = {"enabled": True, "clients": [{"cidr": "127.0.0.0/8"}]}
    op_kube.apply_dd(dd_manifest(NAME, op_namespace, **EMULATED, networkPolicy=narrowed))
    peers = [{"ipBlock": {"cidr": "127.0.0.0/8"}}]

    def narrowed_router() -> bool | None:
        rules = _policies(op_kube, op_namespace).get(f"{NAME}-router", {}).get("spec", {}).get("ingress") or []
        return True if rules and rules[0].get("from") == peers else None

    wait_for(narrowed_router, 60, what="the router's policy narrowed to 127.0.0.0/8")

    # Turning it off prunes every policy; serving goes on.
    op_kube.apply_dd(dd_manifest(NAME, op_namespace, **EMULATED, networkPolicy={"enabled": False}))
    wait_for(lambda: True if not _policies(op_kube, op_namespace) else None, 60, what="policies pruned")
    reply = httpx.post(f"http://{routers[0].status.podIP}:{L.ROUTER_PORT}/v1/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
