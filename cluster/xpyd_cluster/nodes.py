"""The fake nodes of the local cluster: HGX-B200 nodes, two GB200 NVL72 racks and a CPU node."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from xpyd_api import labels as L

# Marks every node this cluster creates, so kwok and the process kubelet know theirs.
LOCAL_NODE = "xpyd.io/local-node"
NODE_IP = "127.0.0.1"


@dataclass(frozen=True)
class NodeShape:
    """What one kind of node offers the scheduler."""

    cpu: str
    memory: str
    gpus: int
    product: str | None
    arch: str = "amd64"


B200 = NodeShape(cpu="224", memory="2Ti", gpus=8, product=L.PRODUCT_B200)
GB200_TRAY = NodeShape(cpu="144", memory="960Gi", gpus=4, product=L.PRODUCT_GB200, arch="arm64")
CPU = NodeShape(cpu="32", memory="128Gi", gpus=0, product=None)

HGX_NODES = 4
NVL72_RACKS = 2
TRAYS_PER_RACK = 18


def clique_id(rack: int) -> str:
    """A stable `<ClusterUUID>.<CliqueID>` per rack, as GPU Feature Discovery writes it."""
    cluster = uuid.uuid5(uuid.NAMESPACE_DNS, f"xpyd-local-nvl72-rack-{rack}")
    return f"{cluster}.{rack}"


def node(name: str, shape: NodeShape, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node manifest with status, as kwok expects: capacity and allocatable survive its stages."""
    node_labels = {
        L.HOSTNAME: name,
        L.ARCH: shape.arch,
        "kubernetes.io/os": "linux",
        "type": "kwok",
        LOCAL_NODE: "true",
    }
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": "110"}
    if shape.product is not None:
        node_labels[L.GPU_PRODUCT] = shape.product
        node_labels[L.GPU_COUNT] = str(shape.gpus)
        resources[L.GPU_RESOURCE] = str(shape.gpus)
    node_labels.update(extra_labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": shape.arch, "operatingSystem": "linux", "kubeletVersion": "kwok"},
        },
    }


def all_nodes() -> list[dict[str, Any]]:
    """Every node of the local cluster, in a stable order."""
    nodes = [node(f"b200-{i}", B200) for i in range(HGX_NODES)]
    for rack in range(NVL72_RACKS):
        nodes += [
            node(f"gb200-r{rack}-t{tray:02d}", GB200_TRAY, {L.GPU_CLIQUE: clique_id(rack)})
            for tray in range(TRAYS_PER_RACK)
        ]
    nodes.append(node("cpu-0", CPU, {"node-role.kubernetes.io/control-plane": ""}))
    return nodes


def topology_of(node_labels: dict[str, str]) -> str:
    """The topology name a node belongs to, for tables and tests."""
    product = node_labels.get(L.GPU_PRODUCT)
    if product == L.PRODUCT_B200:
        return "HGX-B200"
    if product == L.PRODUCT_GB200:
        return "GB200-NVL72"
    return "CPU"
