"""Does one replica fit its GPUs? Weights plus the KV cache of one longest sequence, per GPU.

An engine refuses to start when its GPUs cannot hold the weights and a KV cache for at least one
sequence of its maximum length (vLLM: "the model's max seq len is larger than the maximum number
of tokens that can be stored in KV cache"; SGLang: "not enough memory"). This is that check, done
before a pod exists, for the operator (condition Ready=False, reason ReplicaDoesNotFit) and for
`xpyd plan`, from the model catalog and the GPU table.

Per GPU of a replica with tensor-parallel size tp and data-parallel size dp:
- weights: every rank holds 1/tp of the dense weights; with expert parallelism the routed experts
  are spread over all tp x dp ranks, else each data-parallel rank holds its own copy;
- KV cache: one sequence of max_model_len tokens per data-parallel rank, split over its tp ranks
  by heads (MLA's latent cache is not split: every rank holds all of it);
- usable: the GPU's HBM x the engine's memory utilization (vLLM's --gpu-memory-utilization 0.9).

`smallest_fit` searches the replica sizes a topology offers (powers of two within a node, whole
nodes beyond: up to the NVLink domain where it spans nodes) for the first layout that fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from xpyd_perf.hardware import GpuSpec
from xpyd_perf.models import ModelSpec
from xpyd_perf.topology import NvlinkDomain, Topology

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization (SGLang's --mem-fraction-static is close)
MAX_SEARCH_GPUS: Final = 256  # the API's largest replica (xpyd_api.rules.MAX_REPLICA_GPUS; a test keeps them equal)
NODE_NOUNS: Final[dict[NvlinkDomain, str]] = {"node": "node", "clique": "tray"}  # what one pod's machine is called


@dataclass(frozen=True, slots=True)
class Fit:
    """The numbers behind one verdict; `summary()` is the line conditions and `xpyd plan` print."""

    model: str
    weight_dtype: str
    gpu: str
    tp: int
    dp: int
    expert_parallel: bool
    max_model_len: int
    weight_bytes: float  # the whole checkpoint
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float  # one max_model_len sequence per data-parallel rank
    hbm_bytes_per_gpu: float
    memory_utilization: float
    kv_bytes_per_token: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.hbm_bytes_per_gpu * self.memory_utilization

    @property
    def need_bytes_per_gpu(self) -> float:
        return self.weight_bytes_per_gpu + self.kv_bytes_per_gpu

    @property
    def fits(self) -> bool:
        return self.need_bytes_per_gpu <= self.usable_bytes_per_gpu

    @property
    def kv_room_bytes_per_gpu(self) -> float:
        """HBM left for the KV cache on each GPU after the weights (0 when the weights do not fit)."""
        return max(0.0, self.usable_bytes_per_gpu - self.weight_bytes_per_gpu)

    def spec_fields(self) -> dict[str, int | bool]:
        """The layout as a pool of the DisaggregatedDeployment spells it."""
        return {
            "gpusPerReplica": self.gpus,
            "tensorParallelSize": self.tp,
            "dataParallelSize": self.dp,
            "expertParallel": self.expert_parallel,
        }

    def spec_line(self) -> str:
        """The layout as one line to paste into a pool of the spec (inside its `{...}`)."""
        return ", ".join(f"{k}: {str(v).lower()}" for k, v in self.spec_fields().items())

    def layout(self) -> str:
        parallel = f"TP{self.tp}" + (f" x DP{self.dp}" + (" EP" if self.expert_parallel else "") if self.dp > 1 else "")
        return f"{self.gpus} x {self.gpu} ({parallel})"

    def summary(self) -> str:
        gb = 1e9
        head = (
            f"{self.model} ({self.weight_bytes / gb:.0f} GB of {self.weight_dtype} weights) on {self.layout()}: "
            f"{self.weight_bytes_per_gpu / gb:.1f} GB of weights + {self.kv_bytes_per_gpu / gb:.1f} GB of KV cache "
            f"for one {self.max_model_len}-token sequence = {self.need_bytes_per_gpu / gb:.1f} GB per GPU"
        )
        usable = (
            f"{self.usable_bytes_per_gpu / gb:.1f} GB usable "
            f"({self.memory_utilization:g} x {self.hbm_bytes_per_gpu / gb:.0f} GB HBM)"
        )
        if self.fits:
            return f"{head} <= {usable}: fits"
        return (
            f"{head} > {usable}: does not fit; use more GPUs per replica, a smaller --max-model-len "
            "or a quantized checkpoint (FP8, FP4)"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "weight_dtype": self.weight_dtype,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "tp": self.tp,
            "dp": self.dp,
            "expert_parallel": self.expert_parallel,
            "max_model_len": self.max_model_len,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_bytes_per_gpu": self.kv_bytes_per_gpu,
            "need_bytes_per_gpu": self.need_bytes_per_gpu,
            "usable_bytes_per_gpu": self.usable_bytes_per_gpu,
            "fits": self.fits,
            "summary": self.summary(),
        }


def replica_fit(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    dp: int = 1,
    expert_parallel: bool = False,
    max_model_len: int | None = None,
    kv_bytes_per_token: int | None = None,
    memory_utilization: float = GPU_MEMORY_UTILIZATION,
) -> Fit:
    """Whether one replica of `model` on tp x dp GPUs holds its weights and one longest sequence.

    `max_model_len` defaults to the model's context length (what the engine assumes without
    --max-model-len); `kv_bytes_per_token` overrides the catalog (e.g. half for an FP8 KV cache).
    """
    if tp < 1 or dp < 1:
        raise ValueError(f"tensor- and data-parallel sizes must be >= 1, got tp={tp} dp={dp}")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory utilization must lie in (0, 1], got {memory_utilization}")
    tokens = max_model_len or model.max_model_len
    per_token = kv_bytes_per_token if kv_bytes_per_token is not None else model.kv_bytes_per_token
    bpp = model.weight_bytes_per_param
    experts = model.expert_params
    dense = model.params - experts
    spread = tp * dp if expert_parallel else tp
    weights = (dense / tp + experts / spread) * bpp
    kv = tokens * per_token / (1 if model.mla else tp)
    return Fit(
        model=model.key,
        weight_dtype=model.weight_dtype,
        gpu=gpu.name,
        tp=tp,
        dp=dp,
        expert_parallel=expert_parallel,
        max_model_len=tokens,
        weight_bytes=model.weight_bytes,
        weight_bytes_per_gpu=weights,
        kv_bytes_per_gpu=kv,
        hbm_bytes_per_gpu=gpu.hbm_bytes,
        memory_utilization=memory_utilization,
        kv_bytes_per_token=per_token,
    )


def replica_sizes(topology: Topology, max_gpus: int = MAX_SEARCH_GPUS) -> list[int]:
    """GPU counts a replica may take, smallest first: powers of two within a node, then whole nodes
    (up to the NVLink domain where it spans nodes, e.g. 72 GPUs of an NVL72 rack, else `max_gpus`)."""
    node = topology.gpus_per_node
    limit = topology.domain_gpus if topology.domain_gpus > node else max_gpus
    within = [1 << i for i in range(node.bit_length()) if 1 << i < node]
    return [n for n in [*within, *range(node, limit + 1, node)] if n <= max_gpus]


def layouts(model: ModelSpec, topology: Topology, gpus: int) -> list[tuple[int, int, bool]]:
    """(tp, dp, expert parallel) shapes of a `gpus`-GPU replica, preferred first: a MoE model wide
    expert parallel (TP1 x DP=GPUs, as the seeds run DeepSeek), else tensor parallel inside the NVLink
    domain with a size that divides the attention heads (vLLM's rule)."""
    out: list[tuple[int, int, bool]] = [(1, gpus, True)] if model.is_moe and gpus > 1 else []
    if gpus <= topology.domain_gpus and model.q_heads % gpus == 0:
        out.append((gpus, 1, False))
    return out


def smallest_fit(
    model: ModelSpec,
    topology: Topology,
    max_model_len: int | None = None,
    kv_bytes_per_token: int | None = None,
    memory_utilization: float = GPU_MEMORY_UTILIZATION,
    max_gpus: int = MAX_SEARCH_GPUS,
) -> Fit | None:
    """The smallest replica of `model` on `topology` that holds its weights and one longest sequence
    (its preferred layout at that size); None when no size up to `max_gpus` does."""
    for gpus in replica_sizes(topology, max_gpus):
        for tp, dp, ep in layouts(model, topology, gpus):
            fit = replica_fit(model, topology.gpu, tp, dp, ep, max_model_len, kv_bytes_per_token, memory_utilization)
            if fit.fits:
                return fit
    return None


def layout_problem(topology: Topology, gpus: int, dp: int = 1) -> str | None:
    """Why the API refuses a replica of `gpus` GPUs and `dp` data-parallel ranks on `topology`, or None
    (the mirror of xpyd_api.rules.check_spec's per-pool rules; a test keeps the two in step)."""
    node, domain = topology.gpus_per_node, topology.domain_gpus
    if gpus <= node:
        return None
    if gpus % node:
        return f"gpusPerReplica ({gpus}) must be <= {node} or a multiple of {node} on {topology.name}"
    if dp > 1 and dp % (gpus // node):
        return (
            f"dataParallelSize ({dp}) must be 1 or a multiple of the replica's {gpus // node} nodes on "
            f"{topology.name}: a data-parallel rank never spans nodes"
        )
    if node < domain < gpus:
        return f"gpusPerReplica ({gpus}) must be <= {domain} on {topology.name}: a replica stays in one NVLink domain"
    return None


def pods_per_replica(topology: Topology, gpus: int) -> int:
    """Pods (nodes) one replica takes: one up to a node, whole nodes beyond (a LeaderWorkerSet group)."""
    return max(1, math.ceil(gpus / topology.gpus_per_node))


def span(topology: Topology, gpus: int) -> str:
    """Where one replica of `gpus` GPUs lives, in words: one pod, or a group of pods over whole nodes."""
    noun, node = NODE_NOUNS[topology.nvlink_domain], topology.gpus_per_node
    pods = pods_per_replica(topology, gpus)
    if pods == 1:
        return f"one pod: {gpus} of one {topology.name} {noun}'s {node} GPUs"
    where = "in one NVLink domain" if gpus <= topology.domain_gpus else f"across {pods} NVLink domains"
    return f"{pods} {topology.name} {noun}s of {node} GPUs {where}: a LeaderWorkerSet group of {pods} pods"
