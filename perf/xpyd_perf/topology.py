"""The topology table: GPUs per node, how far NVLink reaches, and how Kubernetes labels the nodes.

Every module that needs a fact about a system kind (placement, the engine's environment, the
CRD's rules, the simulator, the local cluster's fake nodes) asks a `Topology` from this table
instead of comparing names (docs/extend.md). A new kind (GB300 NVL72) is one more
entry; `offered` makes a modelled kind (HGX H200) a `spec.topology.kind` users may pick.
`Parallelism` says how one replica spreads over a kind's GPUs, for the timings of wide expert
parallel replicas that span nodes (`replica_parallelism`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from xpyd_perf.hardware import GPU_ALIASES, GPUS, NVLINK, RDMA, GpuSpec, KvPath, UnknownGpuError, lookup

# Node labels written by NVIDIA GPU Feature Discovery and the kubelet (docs/install.md, step 1).
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
GPU_COUNT: Final = "nvidia.com/gpu.count"
GPU_CLIQUE: Final = "nvidia.com/gpu.clique"  # <ClusterUUID>.<CliqueID>: one NVLink domain (rack)
ARCH: Final = "kubernetes.io/arch"

NvlinkDomain = Literal["node", "clique"]
# The MoE all-to-all kernels: DeepEP's normal (throughput, prefill) kernels send a token once per
# remote NVLink domain and forward it over NVLink there; its low-latency (decode) kernels send one
# copy per expert straight over RDMA. vLLM: --all2all-backend; SGLang: --deepep-mode.
A2aKind = Literal["high_throughput", "low_latency"]
A2A_KINDS: Final[tuple[A2aKind, ...]] = get_args(A2aKind)


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


@dataclass(frozen=True, slots=True)
class Parallelism:
    """One replica's layout: tp x pp GPUs per data-parallel rank, dp ranks, experts over all of them.

    Attention and the dense layers run per data-parallel rank (their weights replicated dp times);
    routed experts are spread over all `world` GPUs (expert parallel with an all-to-all per MoE
    layer, or split by tensor parallel when `expert_parallel` is off). `domain_gpus` of the replica's
    GPUs share one NVLink domain; traffic between domains crosses the NICs.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    domain_gpus: int = 8
    a2a: A2aKind = "high_throughput"
    overlap: bool = False  # two micro-batches hide the all-to-all behind compute (vLLM DBO, SGLang TBO)

    @property
    def world(self) -> int:
        """GPUs of the whole replica."""
        return max(1, self.tp) * max(1, self.pp) * max(1, self.dp)

    @property
    def nvlink_gpus(self) -> int:
        """GPUs of the replica one all-to-all reaches over NVLink (its own domain)."""
        return max(1, min(self.domain_gpus, self.world))

    @property
    def spans_domains(self) -> bool:
        """Whether the replica's all-to-all crosses NICs (it spans NVLink domains)."""
        return self.world > self.domain_gpus

    def describe(self) -> str:
        """E.g. 'DP32 x TP1 over 32 GPUs, EP (high_throughput a2a, 4 NVLink domains)'."""
        domains = -(-self.world // self.nvlink_gpus)
        span = f"{domains} NVLink domain{'s' if domains > 1 else ''}"
        ep = f", EP ({self.a2a} a2a, {span})" if self.expert_parallel else ""
        pp = f" x PP{self.pp}" if self.pp > 1 else ""
        return f"DP{self.dp} x TP{self.tp}{pp} over {self.world} GPUs{ep}"


def replica_parallelism(
    topology: Topology,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    *,
    expert_parallel: bool = False,
    a2a: A2aKind = "high_throughput",
    overlap: bool = False,
) -> Parallelism:
    """The layout of a replica placed on `topology`: its NVLink domain is the node (HGX) or rack (NVL72)."""
    return Parallelism(tp, pp, dp, expert_parallel, topology.domain_gpus, a2a, overlap)


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
    Topology(
        "HGX-H800", GPUS["H800"], 8, "node", 8, "NVIDIA-H800", "amd64", _ONE_NIC_PER_GPU,
        compute_domain=False, offered=False, description="HGX H800: 8x H800 per node (DeepSeek's V3/R1 serving)",
    ),
)  # fmt: skip

OFFERED: Final[tuple[str, ...]] = tuple(name for name, t in TOPOLOGIES.items() if t.offered)

_TOPOLOGY_ALIASES: Final[dict[str, str]] = {
    "hgx-h100": "H100",
    "h200": "HGX-H200",
    "h800": "HGX-H800",
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
