"""The one interface the simulated worker needs from the performance model (tests inject fakes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Perf(Protocol):
    """Timings of one pool's replicas (model, GPU and tensor-parallel size already bound)."""

    kv_capacity_tokens: int
    kv_bytes_per_token: int
    host_bandwidth: float  # bytes/s one GPU's host link moves (KV reloads from a CPU tier)

    def step_seconds(self, chunks: Sequence[tuple[int, int]], batch: int, ctx_total: int) -> float:
        """One step: prefill `chunks` of (new tokens, tokens already cached) plus `batch` decodes."""
        ...

    def decode_step_seconds(self, batch: int, ctx_total: int) -> float:
        """One decode step of `batch` sequences holding `ctx_total` tokens of context in all."""
        ...
