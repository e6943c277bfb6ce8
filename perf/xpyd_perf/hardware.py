"""The GPU catalog: the accelerator facts every timing in xpyd is derived from.

Figures follow the vendors' published specifications. Bandwidths are per direction: NVLink 1.8 TB/s "per
GPU" counts both directions, so one direction carries 900 GB/s on B200/GB200 (450 GB/s on
H100/H200); a 400 Gb/s NIC carries at most 50 GB/s per direction. The H800 (DeepSeek's V3/R1
serving GPU, the seeds' reference deployment) is an H100 with NVLink cut to 400 GB/s both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

KvPath = Literal["NVLink", "RDMA"]
NVLINK: Final[KvPath] = "NVLink"
RDMA: Final[KvPath] = "RDMA"
T = TypeVar("T")


class UnknownGpuError(ValueError):
    """A GPU name that is not in the catalog; the message lists the valid names."""


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
    # bytes/s between the GPU and its host's memory, one direction: PCIe Gen5 x16 on HGX systems,
    # NVLink-C2C (900 GB/s both ways) on Grace superchips; what a CPU KV tier reloads at
    host_bandwidth: float = 64e9

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype ("bf16" or "fp8")."""
        return self.fp8_flops if dtype == "fp8" else self.bf16_flops


_NIC_400G: Final = 50e9
_C2C: Final = 450e9  # NVLink-C2C, Grace to Blackwell, one direction

GPUS: Final[dict[str, GpuSpec]] = {
    "H100": GpuSpec("H100", 0.989e15, 1.979e15, 80e9, 3.35e12, 450e9, _NIC_400G),
    "H200": GpuSpec("H200", 0.989e15, 1.979e15, 141e9, 4.8e12, 450e9, _NIC_400G),
    "H800": GpuSpec("H800", 0.989e15, 1.979e15, 80e9, 3.35e12, 200e9, _NIC_400G),
    "B200": GpuSpec("B200", 2.25e15, 4.5e15, 180e9, 8.0e12, 900e9, _NIC_400G),
    "GB200": GpuSpec("GB200", 2.5e15, 5.0e15, 186e9, 8.0e12, 900e9, _NIC_400G, _C2C),
}

# Other spellings of a GPU; the product labels of GPU Feature Discovery come from the topology table.
GPU_ALIASES: Final[dict[str, str]] = {"h100-sxm": "H100", "h100-sxm5-80gb": "H100"}


def lookup(table: Mapping[str, T], aliases: Mapping[str, str], name: str) -> T | None:
    """The entry for a canonical name or an alias, case-insensitive; None when there is none."""
    key = name.strip().lower()
    for canonical, value in table.items():
        if canonical.lower() == key:
            return value
    alias = aliases.get(key)
    return table[alias] if alias is not None else None
