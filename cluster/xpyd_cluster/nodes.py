"""The fake nodes of the local cluster: HGX-B200 nodes, two GB200 NVL72 racks and a CPU node."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from xpyd_api import fabrics
from xpyd_api import labels as L
from xpyd_perf import TOPOLOGIES, Topology, by_product

# Marks every node this cluster creates, so kwok and the process kubelet know theirs.
LOCAL_NODE = "xpyd.io/local-node"
NODE_IP = "127.0.0.1"


@dataclass(frozen=True)
class NodeShape:
    """What one kind of node offers the scheduler; GPU nodes take their GPUs and labels from the topology."""

    cpu: str
    memory: str
    topology: Topology | None = None  # None: a CPU node

    @property
    def gpus(self) -> int:
        return self.topology.gpus_per_node if self.topology else 0

    @property
    def arch(self) -> str:
        return self.topology.arch if self.topology else "amd64"


B200 = NodeShape(cpu="224", memory="2Ti", topology=TOPOLOGIES["HGX-B200"])
GB200_TRAY = NodeShape(cpu="144", memory="960Gi", topology=TOPOLOGIES["GB200-NVL72"])
CPU = NodeShape(cpu="32", memory="128Gi")

# What the RDMA shared device plugin advertises on a GPU node (network profile InfiniBand): slots that
# each hand a pod every HCA of the node, so engine pods with an RDMA fabric schedule here too.
RDMA_SLOTS = dict.fromkeys(fabrics.PROFILES["InfiniBand"].parts(1).resources, "64")

HGX_NODES = 8  # multi-node e2e: 2-node prefill and decode groups plus one autoscaled group
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
    if shape.topology is not None:
        node_labels.update(shape.topology.node_labels())
        resources[L.GPU_RESOURCE] = str(shape.gpus)
        resources.update(RDMA_SLOTS)
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
    topology = by_product(node_labels.get(L.GPU_PRODUCT))
    return topology.name if topology is not None else "CPU"


def nvlink_domain_of(node_labels: dict[str, str]) -> str:
    """How far a node's NVLink reaches, for tables: its clique, "per node", or "-" on CPU nodes."""
    topology = by_product(node_labels.get(L.GPU_PRODUCT))
    if topology is None:
        return "-"
    return node_labels.get(L.GPU_CLIQUE, "-") if topology.nvlink_domain == "clique" else "per node"
