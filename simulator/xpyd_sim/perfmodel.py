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

# The path names the report uses, by xpyd_perf's KvPath.
PATH_NAMES = {"NVLink": "nvlink", "RDMA": "rdma"}


class PoolPerf:
    """Step timings of one replica: `model` on `gpus` GPUs of `gpu` (the real xpyd_perf formulas).

    A step is priced as xpyd_perf prices a continuous-batching step: prefill chunks and one token
    per running sequence together, max(compute, HBM) plus the fixed step overhead. The replica is
    one engine of all its GPUs (tensor x data parallel, one pod or a multi-node group): its steps are
    priced over all of them, as `xpyd plan` prices a replica; `tp` sets how many rails one request's
    KV cache takes. Its KV cache is the HBM the fits-check leaves after the weights on every GPU.
    """

    __slots__ = ("_attn_per_ctx", "gpu", "gpus", "kv_bytes_per_token", "kv_capacity_tokens", "model", "tp")

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        gpus: int,
        kv_bytes_per_token: int | None = None,
        expert_parallel: bool = False,
    ) -> None:
        self.model = model
        self.gpu = gpu
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
        for new, done in chunks:
            tokens += new
            attn += attention_flops(model, done, done + new)
            kv_read += done + new
        return step_seconds(model, self.gpu, tp=self.gpus, tokens=tokens, attn_flops=attn, kv_tokens_read=kv_read)

    def decode_step_seconds(self, batch: int, ctx_total: int) -> float:
        """One decode step of `batch` sequences holding `ctx_total` tokens of context in all."""
        return step_seconds(
            self.model,
            self.gpu,
            tp=self.gpus,
            tokens=batch,
            attn_flops=self._attn_per_ctx * ctx_total,
            kv_tokens_read=ctx_total,
        )


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
