"""The topology table: GPUs per node, how far NVLink reaches, and how Kubernetes labels the nodes.

Every module that needs a fact about a system kind (placement, the engine's environment, the
CRD's rules, the simulator, the local cluster's fake nodes) asks a `Topology` from this table
instead of comparing names (DESIGN.md sections 4 and 10). A new kind (GB300 NVL72) is one more
entry; `offered` makes a modelled kind (HGX H200) a `spec.topology.kind` users may pick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from xpyd_perf.hardware import GPU_ALIASES, GPUS, NVLINK, RDMA, GpuSpec, KvPath, UnknownGpuError, lookup

# Node labels written by NVIDIA GPU Feature Discovery and the kubelet (DESIGN.md section 4).
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
GPU_COUNT: Final = "nvidia.com/gpu.count"
GPU_CLIQUE: Final = "nvidia.com/gpu.clique"  # <ClusterUUID>.<CliqueID>: one NVLink domain (rack)
ARCH: Final = "kubernetes.io/arch"

NvlinkDomain = Literal["node", "clique"]


class UnknownTopologyError(ValueError):
    """A topology name that is not in the catalog; the message lists the valid names."""


@dataclass(frozen=True, slots=True)
class Topology:
    """A system kind: its GPU, its nodes' shape and labels, and the reach of one NVLink domain."""

    name: str
    gpu: GpuSpec
    gpus_per_node: int  # 8 on an HGX node, 4 on a GB200 tray
    nvlink_domain: NvlinkDomain  # node: NVLink ends at the node; clique: it spans the rack
    domain_gpus: int  # GPUs one NVLink domain holds: 8 (the node) or 72 (the rack)
    product: str  # nvidia.com/gpu.product of its nodes
    arch: str  # kubernetes.io/arch of its nodes
    fabric: str  # the compute network between nodes (one NIC per GPU, gpu.nic_bandwidth each)
    compute_domain: bool  # multi-node NVLink needs an IMEX channel: a ComputeDomain
    offered: bool  # a spec.topology.kind users may pick; else modelled only (xpyd plan / simulate)
    description: str
    # Environment NCCL and the engines need to use multi-node NVLink (MNNVL) once a pod holds the
    # kind's IMEX channel (a ComputeDomain claim): fabric-handle memory and the NVLink SHARP switches.
    mnnvl_env: tuple[tuple[str, str], ...] = ()

    @property
    def nic_bandwidth(self) -> float:
        """Bytes/s one NIC carries in one direction (one NIC per GPU)."""
        return self.gpu.nic_bandwidth

    @property
    def cross_pool_path(self) -> KvPath:
        """The KV path between a prefill and a decode replica placed by the operator.

        Node-domain pools sit on different nodes, so the handoff always crosses a NIC; the pools of
        one deployment share a clique on a rack-scale system, so the handoff stays on NVLink.
        """
        return NVLINK if self.nvlink_domain == "clique" else RDMA

    @property
    def max_replica_gpus(self) -> int:
        """The most GPUs one replica may take: a node where NVLink ends at the node, else the domain."""
        return self.gpus_per_node if self.nvlink_domain == "node" else self.domain_gpus

    def node_selector(self) -> dict[str, str]:
        """What pins a pod to this kind's nodes."""
        return {GPU_PRODUCT: self.product}

    def node_labels(self, clique: str | None = None) -> dict[str, str]:
        """The labels GPU Feature Discovery and the kubelet put on one of its nodes."""
        out = {GPU_PRODUCT: self.product, GPU_COUNT: str(self.gpus_per_node), ARCH: self.arch}
        if clique is not None:
            out[GPU_CLIQUE] = clique
        return out


_ONE_NIC_PER_GPU: Final = "400 Gb/s RDMA NICs, one per GPU, rail-optimized"


def _table(*kinds: Topology) -> dict[str, Topology]:
    return {t.name: t for t in kinds}


TOPOLOGIES: Final[dict[str, Topology]] = _table(
    Topology(
        "HGX-B200", GPUS["B200"], 8, "node", 8, "NVIDIA-B200", "amd64", _ONE_NIC_PER_GPU,
        compute_domain=False, offered=True, description="8x B200 per node; NVLink ends at the node",
    ),
    Topology(
        "GB200-NVL72", GPUS["GB200"], 4, "clique", 72, "NVIDIA-GB200", "arm64", _ONE_NIC_PER_GPU,
        compute_domain=True, offered=True, description="18 trays x 4 GB200; NVLink spans the rack",
        mnnvl_env=(("NCCL_MNNVL_ENABLE", "1"), ("NCCL_CUMEM_ENABLE", "1"), ("NCCL_NVLS_ENABLE", "1")),
    ),
    Topology(
        "H100", GPUS["H100"], 8, "node", 8, "NVIDIA-H100-80GB-HBM3", "amd64", _ONE_NIC_PER_GPU,
        compute_domain=False, offered=False, description="HGX H100: 8x H100 per node; NVLink ends at the node",
    ),
    Topology(
        "HGX-H200", GPUS["H200"], 8, "node", 8, "NVIDIA-H200", "amd64", _ONE_NIC_PER_GPU,
        compute_domain=False, offered=False, description="HGX H200: 8x H200 per node",
    ),
)  # fmt: skip

OFFERED: Final[tuple[str, ...]] = tuple(name for name, t in TOPOLOGIES.items() if t.offered)

_TOPOLOGY_ALIASES: Final[dict[str, str]] = {
    "hgx-h100": "H100",
    "h200": "HGX-H200",
    "b200": "HGX-B200",
    "gb200": "GB200-NVL72",
    "nvl72": "GB200-NVL72",
}
# GPU Feature Discovery's product labels name the GPU too.
_PRODUCT_GPUS: Final[dict[str, str]] = {t.product.lower(): t.gpu.name for t in TOPOLOGIES.values()}


def resolve_topology(name: str) -> Topology:
    """The topology for a name such as HGX-B200, GB200-NVL72 or H100, case-insensitive."""
    found = lookup(TOPOLOGIES, _TOPOLOGY_ALIASES, name)
    if found is None:
        raise UnknownTopologyError(f"unknown topology {name!r}; valid topologies: {', '.join(TOPOLOGIES)}")
    return found


def resolve_gpu(name: str) -> GpuSpec:
    """The GPU for a catalog name or a GPU Feature Discovery product label, case-insensitive."""
    found = lookup(GPUS, {**GPU_ALIASES, **_PRODUCT_GPUS}, name)
    if found is None:
        raise UnknownGpuError(f"unknown GPU {name!r}; valid GPUs: {', '.join(GPUS)}")
    return found


def by_product(product: str | None) -> Topology | None:
    """The topology whose nodes carry this nvidia.com/gpu.product label (None for CPU nodes)."""
    return next((t for t in TOPOLOGIES.values() if t.product == product), None)
