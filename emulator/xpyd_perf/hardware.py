"""GPU and topology catalogs: the hardware facts every timing in xpyd is derived from.

Figures follow DESIGN.md sections 4 and 8. Bandwidths are per direction: NVLink 1.8 TB/s "per
GPU" counts both directions, so one direction carries 900 GB/s on B200/GB200 (450 GB/s on
H100/H200); a 400 Gb/s NIC carries at most 50 GB/s per direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

KvPath = Literal["NVLink", "RDMA"]
NVLINK: Final[KvPath] = "NVLink"
RDMA: Final[KvPath] = "RDMA"


class UnknownGpuError(ValueError):
    """A GPU name that is not in the catalog; the message lists the valid names."""


class UnknownTopologyError(ValueError):
    """A topology name that is not in the catalog; the message lists the valid names."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: dense peak FLOP/s, HBM size and bandwidth, per-direction link bandwidths."""

    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    nvlink_bandwidth: float  # bytes/s per GPU, one direction
    nic_bandwidth: float  # bytes/s per NIC, one direction (one NIC per GPU)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype ("bf16" or "fp8")."""
        return self.fp8_flops if dtype == "fp8" else self.bf16_flops


@dataclass(frozen=True, slots=True)
class Topology:
    """A system kind: which GPU, how many per node, and how far one NVLink domain reaches."""

    name: str
    gpu: GpuSpec
    gpus_per_node: int
    nvlink_domain_gpus: int  # 8 on HGX (the node), 72 on NVL72 (the rack)
    description: str

    @property
    def cross_pool_path(self) -> KvPath:
        """The KV path between a prefill and a decode replica placed by the operator.

        HGX pools sit on different nodes, so the handoff always crosses a NIC; NVL72 pools of
        one deployment share a clique, so the handoff stays on NVLink.
        """
        return NVLINK if self.nvlink_domain_gpus > self.gpus_per_node else RDMA


_NIC_400G: Final = 50e9

GPUS: Final[dict[str, GpuSpec]] = {
    "H100": GpuSpec("H100", 0.989e15, 1.979e15, 80e9, 3.35e12, 450e9, _NIC_400G),
    "H200": GpuSpec("H200", 0.989e15, 1.979e15, 141e9, 4.8e12, 450e9, _NIC_400G),
    "B200": GpuSpec("B200", 2.25e15, 4.5e15, 180e9, 8.0e12, 900e9, _NIC_400G),
    "GB200": GpuSpec("GB200", 2.5e15, 5.0e15, 186e9, 8.0e12, 900e9, _NIC_400G),
}

_GPU_ALIASES: Final[dict[str, str]] = {
    "nvidia-h100-80gb-hbm3": "H100",
    "h100-sxm": "H100",
    "h100-sxm5-80gb": "H100",
    "nvidia-h200": "H200",
    "nvidia-b200": "B200",
    "nvidia-gb200": "GB200",
}

TOPOLOGIES: Final[dict[str, Topology]] = {
    "HGX-B200": Topology("HGX-B200", GPUS["B200"], 8, 8, "8x B200 per node; NVLink ends at the node"),
    "GB200-NVL72": Topology("GB200-NVL72", GPUS["GB200"], 4, 72, "18 trays x 4 GB200; NVLink spans the rack"),
    "H100": Topology("H100", GPUS["H100"], 8, 8, "HGX H100: 8x H100 per node; NVLink ends at the node"),
    "HGX-H200": Topology("HGX-H200", GPUS["H200"], 8, 8, "HGX H200: 8x H200 per node"),
}

_TOPOLOGY_ALIASES: Final[dict[str, str]] = {
    "hgx-h100": "H100",
    "h200": "HGX-H200",
    "b200": "HGX-B200",
    "gb200": "GB200-NVL72",
    "nvl72": "GB200-NVL72",
}


def resolve_gpu(name: str) -> GpuSpec:
    """The GPU for a catalog name or a GPU Feature Discovery product label, case-insensitive."""
    key = name.strip().lower()
    for canonical in GPUS:
        if canonical.lower() == key:
            return GPUS[canonical]
    if key in _GPU_ALIASES:
        return GPUS[_GPU_ALIASES[key]]
    raise UnknownGpuError(f"unknown GPU {name!r}; valid GPUs: {', '.join(GPUS)}")


def resolve_topology(name: str) -> Topology:
    """The topology for a name such as HGX-B200, GB200-NVL72 or H100, case-insensitive."""
    key = name.strip().lower()
    for canonical in TOPOLOGIES:
        if canonical.lower() == key:
            return TOPOLOGIES[canonical]
    if key in _TOPOLOGY_ALIASES:
        return TOPOLOGIES[_TOPOLOGY_ALIASES[key]]
    raise UnknownTopologyError(f"unknown topology {name!r}; valid topologies: {', '.join(TOPOLOGIES)}")
