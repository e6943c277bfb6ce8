"""The cluster itself: GPU scheduling by topology, loopback pods that serve, and RBAC that bites."""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from typing import Any

import pytest

from .kube import apply, get_json, is_local_cluster, kubectl, pod_ready, wait_until

pytestmark = pytest.mark.e2e

PAUSE = "registry.k8s.io/pause:3.10"


def gpu_pod(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": PAUSE, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            **spec,
        },
    }


def scheduled_node(namespace: str, name: str) -> str:
    def node_name() -> str | None:
        return get_json("pod", name, "-n", namespace)["spec"].get("nodeName")  # type: ignore[no-any-return]

    return wait_until(f"pod {name} scheduled", node_name, timeout=60)


def node_labels(node: str) -> dict[str, str]:
    return dict(get_json("node", node)["metadata"]["labels"])


def test_eight_gpu_pod_lands_on_a_b200_node(namespace: str) -> None:
    apply([gpu_pod("b200", 8, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"})], namespace)
    labels = node_labels(scheduled_node(namespace, "b200"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-B200"
    assert labels["nvidia.com/gpu.count"] == "8"


def test_clique_affinity_keeps_a_pod_in_its_rack(namespace: str) -> None:
    cliques = sorted(
        {
            n["metadata"]["labels"]["nvidia.com/gpu.clique"]
            for n in get_json("nodes", "-l", "nvidia.com/gpu.clique")["items"]
        }
    )
    assert len(cliques) >= 2, f"expected two NVL72 racks, found cliques {cliques}"
    target = cliques[-1]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "In", "values": [target]}]}
                ]
            }
        }
    }
    apply([gpu_pod(f"tray-{i}", 4, affinity=affinity) for i in range(3)], namespace)
    for i in range(3):
        labels = node_labels(scheduled_node(namespace, f"tray-{i}"))
        assert labels["nvidia.com/gpu.clique"] == target
        assert labels["kubernetes.io/arch"] == "arm64"


def test_nine_gpu_pod_stays_pending_with_the_schedulers_reason(namespace: str) -> None:
    apply([gpu_pod("too-big", 9)], namespace)

    def unschedulable() -> str | None:
        pod = get_json("pod", "too-big", "-n", namespace)
        for c in pod.get("status", {}).get("conditions", []):
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return None

    message = wait_until("PodScheduled=False/Unschedulable", unschedulable, timeout=60)
    assert "Insufficient nvidia.com/gpu" in message
    assert get_json("pod", "too-big", "-n", namespace)["status"]["phase"] == "Pending"


def web_statefulset(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx:1.27",
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }


def test_statefulset_pods_get_distinct_loopback_ips_that_answer(namespace: str) -> None:
    apply([web_statefulset(3)], namespace)

    def ready_pods() -> list[dict[str, Any]] | None:
        pods = get_json("pods", "-n", namespace, "-l", "app=web")["items"]
        ready = [p for p in pods if pod_ready(p)]
        return ready if len(ready) == 3 else None

    pods = wait_until("3 ready web pods", ready_pods, timeout=90)
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 3, ips
    if not is_local_cluster():
        return  # on kind or a real cluster pod IPs are not reachable from the test host
    for ip in ips:
        assert ipaddress.ip_address(ip).is_loopback, ip
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
            assert resp.status == 200
    victim = pods[0]
    kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=true", "--timeout=60s")
    old_ip = victim["status"]["podIP"]

    def stopped() -> bool:
        try:
            urllib.request.urlopen(f"http://{old_ip}:8080/", timeout=1)
        except OSError:
            return True
        replacement = get_json("pod", victim["metadata"]["name"], "-n", namespace, "--ignore-not-found")
        return replacement is not None and replacement.get("status", {}).get("podIP") == old_ip

    wait_until("the deleted pod's process to stop", stopped, timeout=30)


def _token(namespace: str, sa: str) -> str:
    return kubectl("create", "token", sa, "-n", namespace, "--duration=10m").stdout.strip()


def test_service_account_can_do_exactly_what_its_role_allows(namespace: str) -> None:
    apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        ],
        namespace,
    )
    token = _token(namespace, "reader")
    as_reader = (
        ["--token", token, "--kubeconfig", "/dev/null", "--server", _server(), "--certificate-authority", _ca_file()]
        if is_local_cluster()
        else ["--token", token]
    )
    allowed = wait_until(
        "RBAC to allow listing pods",
        lambda: kubectl("get", "pods", "-n", namespace, *as_reader, check=False).returncode == 0,
    )
    assert allowed
    denied = kubectl("get", "secrets", "-n", namespace, *as_reader, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower() and 'cannot list resource "secrets"' in denied.stderr
    other = kubectl("get", "pods", "-n", "kube-system", *as_reader, check=False)
    assert other.returncode != 0 and "forbidden" in other.stderr.lower()


def _server() -> str:
    config = json.loads(kubectl("config", "view", "--minify", "--raw", "-o", "json").stdout)
    return str(config["clusters"][0]["cluster"]["server"])


def _ca_file() -> str:
    config = json.loads(kubectl("config", "view", "--minify", "--raw", "-o", "json").stdout)
    return str(config["clusters"][0]["cluster"]["certificate-authority"])


IN_POD_CHECK = """
import sys
from lightkube import Client, ApiError
from lightkube.resources.core_v1 import Pod, Secret
c = Client()
ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()
assert any(True for _ in c.list(Pod, namespace=ns)), 'could not list pods'
try:
    list(c.list(Secret, namespace=ns))
except ApiError as e:
    sys.exit(0 if e.status.code == 403 else 3)
sys.exit(4)
"""


def test_pod_uses_its_projected_token_in_cluster(namespace: str) -> None:
    if not is_local_cluster():
        pytest.skip("runs our image as a local process: only on xpyd's local cluster")
    test_service_account_can_do_exactly_what_its_role_allows(namespace)
    apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "in-cluster"},
                "spec": {
                    "serviceAccountName": "reader",
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "check", "image": "ghcr.io/xpyd/xpyd:dev", "command": ["python", "-c", IN_POD_CHECK]}
                    ],
                },
            }
        ],
        namespace,
    )
    phase = wait_until(
        "the in-cluster pod to finish",
        lambda: (
            get_json("pod", "in-cluster", "-n", namespace)["status"].get("phase") in {"Succeeded", "Failed"}
            and get_json("pod", "in-cluster", "-n", namespace)["status"]["phase"]
        ),
        timeout=60,
    )
    assert phase == "Succeeded"
