"""The operator's RBAC: just what it touches, no Secrets or wildcards, enough to grant the router's Role."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_chart.helm import one, template
from xpyd_operator.routerkit import RULES as ROUTER_RULES

pytestmark = pytest.mark.usefixtures("helm")

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

READ = ("get", "list", "watch")
OWN = (*READ, "create", "patch", "delete")  # server-side apply creates on first apply

# What operator/xpyd_operator touches (kube.py, autoscaling/loop.py, handlers.py), per scope. Namespaced:
# its CR (+status), the children it server-side-applies, pods/endpointslices it reads (and grants
# the router), the Events it posts. Kopf runs standalone with event handlers only: no peering
# objects, no finalizers or annotations on the CR.
NAMESPACED: dict[tuple[str, str], tuple[str, ...]] = {
    ("xpyd.io", "disaggregateddeployments"): READ,
    ("xpyd.io", "disaggregateddeployments/status"): ("patch",),
    ("apps", "statefulsets"): OWN,
    ("apps", "deployments"): OWN,
    ("", "services"): OWN,
    ("", "serviceaccounts"): OWN,
    ("policy", "poddisruptionbudgets"): OWN,
    ("rbac.authorization.k8s.io", "roles"): OWN,
    ("rbac.authorization.k8s.io", "rolebindings"): OWN,
    ("networking.k8s.io", "networkpolicies"): OWN,  # spec.networkPolicy (netpolicy.py)
    ("resource.nvidia.com", "computedomains"): OWN,
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): OWN,
    ("monitoring.coreos.com", "podmonitors"): OWN,  # TLS routers' PodMonitors (routerkit.pod_monitor)
    ("", "pods"): READ,
    ("discovery.k8s.io", "endpointslices"): READ,
    ("", "events"): ("create",),
    ("", "configmaps"): ("get",),  # spec.model.configMap, by name (reconcile.Reconciler._model_config)
}
CLUSTER: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "nodes"): READ,
    ("apiextensions.k8s.io", "customresourcedefinitions"): READ,
}
# NVL72 placement lists pods and xpyd StatefulSets in every namespace (kube.Kube.observe).
CLUSTER_WORKLOAD_READS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): READ,
    ("apps", "statefulsets"): READ,
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): READ,
}


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def expand(table: dict[tuple[str, str], tuple[str, ...]]) -> set[Grant]:
    return {(group, resource, verb) for (group, resource), verbs in table.items() for verb in verbs}


def _roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Role", "ClusterRole")]


def test_cluster_mode_grants_exactly_what_the_operator_uses() -> None:
    role = one(template(), "ClusterRole")
    assert grants(role["rules"]) == expand(NAMESPACED) | expand(CLUSTER)


def test_namespaced_mode_splits_role_and_cluster_reads() -> None:
    docs = template({"operator.watchNamespace": "team-a"})
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "team-a"
    assert grants(role["rules"]) == expand(NAMESPACED)
    cluster = one(docs, "ClusterRole", "-cluster-reads")
    assert grants(cluster["rules"]) == expand(CLUSTER) | expand(CLUSTER_WORKLOAD_READS)
    assert one(docs, "RoleBinding")["metadata"]["namespace"] == "team-a"


@pytest.mark.parametrize("values", [{}, {"operator.watchNamespace": "team-a"}])
def test_no_secrets_no_configmap_listing_or_wildcards(values: dict[str, str]) -> None:
    for role in _roles(template(values)):
        for group, resource, verb in grants(role["rules"]):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert resource != "secrets", role["metadata"]["name"]
            assert resource != "configmaps" or verb == "get", role["metadata"]["name"]  # by name: no list, no watch
            assert verb not in ("escalate", "bind", "impersonate"), role["metadata"]["name"]
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            assert "resourceNames" not in rule


def test_cluster_wide_grants_are_read_only_in_namespaced_mode() -> None:
    docs = template({"operator.watchNamespace": "team-a"})
    for role in docs:
        if role["kind"] == "ClusterRole":
            assert {verb for _, _, verb in grants(role["rules"])} <= set(READ)


def test_operator_holds_every_permission_it_grants_the_router() -> None:
    """RBAC refuses to create a Role granting more than the creator holds (no escalate verb)."""
    held = grants(one(template(), "ClusterRole")["rules"])
    assert grants(ROUTER_RULES) <= held
    scoped = grants(one(template({"operator.watchNamespace": "team-a"}), "Role")["rules"])
    assert grants(ROUTER_RULES) <= scoped


@pytest.mark.parametrize("values", [{}, {"operator.watchNamespace": "team-a"}])
def test_bindings_name_the_chart_service_account(values: dict[str, str]) -> None:
    docs = template(values)
    account = one(docs, "ServiceAccount")["metadata"]
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        roles = {r["metadata"]["name"] for r in _roles(docs) if r["kind"] == binding["roleRef"]["kind"]}
        assert binding["roleRef"]["name"] in roles
