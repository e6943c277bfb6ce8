"""What a CPU-held prefix is worth to a request: its reload over the host link against recomputing it.

A block an engine offloaded to its CPU tier is not free: the engine copies it back to the GPU over the
host link (PCIe Gen5 on HGX systems, NVLink-C2C on Grace superchips: `GpuSpec.host_bandwidth`) before
the prompt's prefill can go on. Recomputing it instead costs the prefill of those tokens after the
GPU-held prefix (xpyd_perf's roofline step, the attention over everything before them included). The
reload pays by what it saves: `worth` is the share of the recompute time it saves, 0 when it saves
nothing (a fast GPU and a slow link, a small model with a large KV per token), so a scorer counts a
CPU-held block as that fraction of a GPU-held one.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpyd_perf import GpuSpec, ModelSpec, attention_flops, step_seconds
from xpyd_perf.timing import STEP_OVERHEAD_S

HOST_LINK_EFFICIENCY = 0.8  # the share of the host link's rate a reload of whole blocks achieves


@dataclass(frozen=True, slots=True)
class ReloadCost:
    """Prices reloads and recomputes of one pool's replicas: `model` on `tp` GPUs of `gpu`."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    kv_bytes_per_token: int | None = None  # the engine's figure (fp8 KV halves it); the model's when None

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"reload pricing needs tp >= 1, got {self.tp}")
        if self.gpu.host_bandwidth <= 0:
            raise ValueError(f"{self.gpu.name} has no host link bandwidth to reload KV over")

    @property
    def bytes_per_token(self) -> int:
        return self.kv_bytes_per_token or self.model.kv_bytes_per_token

    def reload_seconds(self, tokens: int) -> float:
        """Copying `tokens` tokens of KV from host memory to the replica's GPUs (each GPU its shard,
        over its own link)."""
        if tokens <= 0:
            return 0.0
        rate = self.gpu.host_bandwidth * HOST_LINK_EFFICIENCY * self.tp
        return tokens * self.bytes_per_token / rate

    def recompute_seconds(self, start: int, tokens: int) -> float:
        """Prefilling `tokens` tokens that follow `start` cached ones (the step's fixed overhead left
        out: the prompt's prefill pays it either way)."""
        if tokens <= 0:
            return 0.0
        model = self.model
        step = step_seconds(
            model, self.gpu, tp=self.tp, tokens=tokens, attn_flops=attention_flops(model, start, start + tokens),
            kv_tokens_read=start + tokens,
        )  # fmt: skip
        return max(0.0, step - STEP_OVERHEAD_S)

    def worth(self, start: int, tokens: int) -> float:
        """The share of recomputing `tokens` tokens after `start` cached ones that reloading them saves:
        in [0, 1], 0 when the reload takes as long as the recompute or longer."""
        recompute = self.recompute_seconds(start, tokens)
        if recompute <= 0:
            return 0.0
        return max(0.0, 1.0 - self.reload_seconds(tokens) / recompute)
