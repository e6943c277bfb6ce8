"""Binds xpyd_perf's roofline model to one pool's hardware, in the shapes the simulated worker asks for."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_perf import (
    GpuSpec,
    ModelSpec,
    Topology,
    attention_flops,
    handoff_lanes,
    handoff_seconds,
    kv_bytes,
    path_between,
    replica_fit,
    step_seconds,
)
from xpyd_perf.timing import group_step_seconds
from xpyd_perf.topology import A2aKind, Parallelism, replica_parallelism

# The path names the report uses, by xpyd_perf's KvPath.
PATH_NAMES = {"NVLink": "nvlink", "RDMA": "rdma"}


class PoolPerf:
    """Step timings of one replica: `model` on `gpus` GPUs of `gpu` (the real xpyd_perf formulas).

    A step is priced as xpyd_perf prices a continuous-batching step: prefill chunks and one token
    per running sequence together, max(compute, HBM) plus the fixed step overhead. The replica is
    one engine of all its GPUs (tensor x data parallel, one pod or a multi-node group): its steps are
    priced over all of them, as `xpyd plan` prices a replica; `tp` sets how many rails one request's
    KV cache takes. Its KV cache is the HBM the fits-check leaves after the weights on every GPU.
    A data- or expert-parallel replica (`parallel`) is priced as the emulator prices it: its ranks in
    lockstep, paced by the busiest, plus the MoE all-to-all (xpyd_perf.timing.group_step_seconds).
    """

    __slots__ = (
        "_attn_per_ctx", "gpu", "gpus", "host_bandwidth", "kv_bytes_per_token", "kv_capacity_tokens", "model",
        "parallel", "tp",
    )  # fmt: skip

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        gpus: int,
        kv_bytes_per_token: int | None = None,
        expert_parallel: bool = False,
        parallel: Parallelism | None = None,
    ) -> None:
        self.model = model
        self.parallel = parallel
        self.gpu = gpu
        self.host_bandwidth = gpu.host_bandwidth
        self.tp = max(1, tp)
        self.gpus = max(self.tp, gpus)
        self.kv_bytes_per_token = kv_bytes_per_token or model.kv_bytes_per_token
        fit = replica_fit(model, gpu, self.tp, max(1, self.gpus // self.tp), expert_parallel)
        free = fit.kv_room_bytes_per_gpu * self.gpus
        self.kv_capacity_tokens = max(0, int(free // self.kv_bytes_per_token))
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"{model.key} does not fit on {gpus} x {gpu.name}: no room left for the KV cache")
        self._attn_per_ctx = 4.0 * model.layers * model.q_heads * model.attn_head_dim

    def step_seconds(self, chunks: Sequence[tuple[int, int]], batch: int, ctx_total: int) -> float:
        """One step: prefill `chunks` of (new tokens, tokens already cached) plus `batch` decodes."""
        model = self.model
        tokens = batch
        attn = self._attn_per_ctx * ctx_total
        kv_read = ctx_total
        largest = 0
        for new, done in chunks:
            tokens += new
            largest = max(largest, new)
            attn += attention_flops(model, done, done + new)
            kv_read += done + new
        return self._step(tokens, attn, kv_read, largest)

    def decode_step_seconds(self, batch: int, ctx_total: int) -> float:
        """One decode step of `batch` sequences holding `ctx_total` tokens of context in all."""
        return self._step(batch, self._attn_per_ctx * ctx_total, ctx_total, 1)

    def _step(self, tokens: int, attn: float, kv_read: int, largest: int) -> float:
        par = self.parallel
        if par is None:
            return step_seconds(
                self.model, self.gpu, tp=self.gpus, tokens=tokens, attn_flops=attn, kv_tokens_read=kv_read
            )
        busiest = max(-(-tokens // max(1, par.dp)), largest)  # one prompt's chunk stays on one rank
        return group_step_seconds(
            self.model, self.gpu, par, tokens=tokens, attn_flops=attn, kv_tokens_read=kv_read, busiest=busiest
        )


def group_parallelism(topology: Topology, role: str, tp: int, gpus: int, expert_parallel: bool) -> Parallelism | None:
    """The data/expert-parallel layout of a replica the emulator would time as a group; None for plain TP.

    The all-to-all kernel follows the role, as the operator sets it: DeepEP's throughput kernels for
    prefill (and a co-located pool), its low-latency kernels for decode.
    """
    dp = max(1, gpus // max(1, tp))
    if dp == 1 and not expert_parallel:
        return None
    a2a: A2aKind = "low_latency" if role == "decode" else "high_throughput"
    return replica_parallelism(topology, tp, 1, dp, expert_parallel=expert_parallel, a2a=a2a)


class Links:
    """KV handoff timing between two replicas, by the NVLink domains they were placed in."""

    __slots__ = ("dp_attention", "topology")

    def __init__(self, topology: Topology, dp_attention: bool = False) -> None:
        self.topology = topology
        self.dp_attention = dp_attention

    def handoff(
        self, tokens: int, src_perf: PoolPerf, dst_perf: PoolPerf, src_domain: str, dst_domain: str
    ) -> tuple[float, str, int]:
        """Seconds, path name and bytes of moving `tokens` tokens of KV from src to dst."""
        path = path_between(src_domain, dst_domain)
        lanes = handoff_lanes(src_perf.model, src_perf.tp, dst_perf.tp, self.dp_attention)
        size = kv_bytes(src_perf.model, tokens, src_perf.kv_bytes_per_token)
        return handoff_seconds(size, path, self.topology.gpu, lanes), PATH_NAMES[path], size
