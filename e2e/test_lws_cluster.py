"""LeaderWorkerSet on the cluster: groups of pods with LWS env and labels, leader names, and group recreation."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from xpyd_api import labels as L

from .kube import apply, find_json, get_json, is_local_cluster, kubectl, pod_ready, wait_until

pytestmark = pytest.mark.e2e

LWS = "grp"
SIZE, REPLICAS = 2, 2
# pod name -> (group index, worker index): the leader is <lws>-<group>, its workers <lws>-<group>-<worker>
INDEX = {(f"{LWS}-{g}-{w}" if w else f"{LWS}-{g}"): (g, w) for g in range(REPLICAS) for w in range(SIZE)}
NAMES = sorted(INDEX)


@pytest.fixture(autouse=True)
def _lws_installed() -> None:
    if find_json("crd", f"{L.LWS_PLURAL}.{L.LWS_GROUP}") is None:
        pytest.fail(
            "the LeaderWorkerSet CRD is not installed on this cluster: "
            "install LeaderWorkerSet v0.7.0+ (the local cluster has it)"
        )


def leaderworkerset() -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "nginx:1.27",  # the local cluster runs a placeholder answering HTTP on the port
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    return {
        "apiVersion": f"{L.LWS_GROUP}/{L.LWS_VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": LWS},
        "spec": {
            "replicas": REPLICAS,
            "leaderWorkerTemplate": {
                "size": SIZE,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": {"spec": {"terminationGracePeriodSeconds": 2, "containers": [container]}},
            },
        },
    }


def pods_by_name(namespace: str) -> dict[str, dict[str, Any]]:
    items = get_json("pods", "-n", namespace, "-l", f"{L.LWS_NAME}={LWS}")["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def all_ready(namespace: str) -> dict[str, dict[str, Any]] | None:
    pods = pods_by_name(namespace)
    running = all(pod_ready(p) and p["status"]["phase"] == "Running" for p in pods.values())
    return pods if sorted(pods) == NAMES and running else None


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def leader_address(namespace: str, group: int) -> str:
    return f"{LWS}-{group}.{LWS}.{namespace}"


def cluster_state() -> Path:
    """The local cluster's state folder: the one holding the kubeconfig `xpyd cluster up` wrote."""
    return Path(os.environ["KUBECONFIG"]).resolve().parent


def hosts_map() -> dict[str, str]:
    lines = (cluster_state() / "hosts").read_text().splitlines()
    return {name: ip for ip, name in (line.split() for line in lines if line and not line.startswith("#"))}


def process_env(pod: dict[str, Any]) -> dict[str, str]:
    pid = int((cluster_state() / "pods" / pod["metadata"]["uid"] / "pid").read_text())
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def group_pods(namespace: str) -> dict[str, dict[str, Any]]:
    apply([leaderworkerset()], namespace)
    return wait_until(f"{len(NAMES)} Running, Ready pods {NAMES}", lambda: all_ready(namespace), timeout=90)


def test_pods_carry_the_groups_labels_and_env(namespace: str, group_pods: dict[str, dict[str, Any]]) -> None:
    keys: dict[int, set[str]] = {}
    for name, pod in group_pods.items():
        group, worker = INDEX[name]
        labels, env = pod["metadata"]["labels"], env_of(pod)
        assert labels[L.LWS_NAME] == LWS
        assert (labels[L.LWS_GROUP_INDEX], labels[L.LWS_WORKER_INDEX]) == (str(group), str(worker))
        assert pod["metadata"]["annotations"][L.LWS_SIZE] == str(SIZE)
        assert env[L.ENV_LWS_LEADER_ADDRESS] == leader_address(namespace, group)
        assert (env[L.ENV_LWS_GROUP_SIZE], env[L.ENV_LWS_WORKER_INDEX]) == (str(SIZE), str(worker))
        keys.setdefault(group, set()).add(labels[L.LWS_GROUP_KEY])
    assert all(len(k) == 1 for k in keys.values()) and len(set.union(*keys.values())) == REPLICAS
    if not is_local_cluster():
        return
    process = process_env(group_pods[f"{LWS}-1-1"])  # what the worker's process really got
    assert process[L.ENV_LWS_LEADER_ADDRESS] == leader_address(namespace, 1)
    assert process[L.ENV_LWS_WORKER_INDEX] == "1"
    assert Path(process[L.ENV_HOSTS_FILE]) == cluster_state() / "hosts"


def test_hosts_file_names_every_leader(namespace: str, group_pods: dict[str, dict[str, Any]]) -> None:
    if not is_local_cluster():
        pytest.skip("the hosts file is the local cluster's stand-in for DNS")
    names = hosts_map()
    for group in range(REPLICAS):
        ip = group_pods[f"{LWS}-{group}"]["status"]["podIP"]
        address = leader_address(namespace, group)
        assert names[address] == names[f"{address}.svc"] == names[f"{address}.svc.cluster.local"] == ip
        worker = group_pods[f"{LWS}-{group}-1"]
        assert names[f"{LWS}-{group}-1.{LWS}.{namespace}"] == worker["status"]["podIP"]


def uids(pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: pod["metadata"]["uid"] for name, pod in pods.items()}


def wait_group_recreated(namespace: str, before: dict[str, str], group: int) -> dict[str, dict[str, Any]]:
    """Every pod of `group` has a new uid and is Ready again; the other groups' pods kept theirs."""
    ours = {n for n, (g, _) in INDEX.items() if g == group}

    def recreated() -> dict[str, dict[str, Any]] | None:
        pods = all_ready(namespace)
        if pods is None or any(uids(pods)[n] == before[n] for n in ours):
            return None
        return pods

    pods = wait_until(f"group {group} recreated and Ready", recreated, timeout=90)
    assert {n: u for n, u in uids(pods).items() if n not in ours} == {n: u for n, u in before.items() if n not in ours}
    leader = pods[f"{LWS}-{group}"]
    workers = get_json("statefulset", f"{LWS}-{group}", "-n", namespace)
    assert [o["uid"] for o in workers["metadata"]["ownerReferences"]] == [leader["metadata"]["uid"]]
    return pods


def test_deleting_a_worker_recreates_its_whole_group(namespace: str, group_pods: dict[str, dict[str, Any]]) -> None:
    before = uids(group_pods)
    kubectl("delete", "pod", f"{LWS}-0-1", "-n", namespace, "--wait=false")
    pods = wait_group_recreated(namespace, before, group=0)
    if is_local_cluster():
        leader_ip, address = pods[f"{LWS}-0"]["status"]["podIP"], leader_address(namespace, 0)
        wait_until("the hosts file to name the new leader", lambda: hosts_map().get(address) == leader_ip, timeout=30)


def test_a_container_restart_recreates_its_whole_group(namespace: str, group_pods: dict[str, dict[str, Any]]) -> None:
    if not is_local_cluster():
        pytest.skip("kills the worker's process, which only the local cluster's kubelet exposes")
    before = uids(group_pods)
    victim = group_pods[f"{LWS}-1-1"]
    pid = int((cluster_state() / "pods" / victim["metadata"]["uid"] / "pid").read_text())
    os.kill(pid, signal.SIGKILL)  # the pod's own process, started by the kubelet for this test's pod
    wait_group_recreated(namespace, before, group=1)
