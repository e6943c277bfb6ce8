"""The break-even verdict (disaggregate iff t_transfer < t_stall) and a suggested xPyD ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xpyd_perf.fits import GPU_MEMORY_UTILIZATION as GPU_MEMORY_UTILIZATION  # the simulator reads it here
from xpyd_perf.fits import replica_fit
from xpyd_perf.models import ModelSpec, resolve_model
from xpyd_perf.timing import (
    decode_step_seconds,
    handoff_lanes,
    handoff_seconds,
    kv_bytes,
    prefill_seconds,
    stall_seconds,
)
from xpyd_perf.topology import Topology, resolve_topology


@dataclass(frozen=True, slots=True)
class BreakEven:
    """The numbers behind one verdict; `summary()` is the one-line form for conditions and logs."""

    model: str
    topology: str
    prompt_tokens: int
    gpus_per_replica: int
    kv_bytes: int
    kv_path: str  # "NVLink" | "RDMA"
    lanes: int
    transfer_seconds: float
    prefill_seconds: float
    stall_seconds: float
    disaggregate: bool

    @property
    def transfer_over_prefill(self) -> float:
        """The handoff's cost relative to the prefill it follows (the seed's "~3%")."""
        return self.transfer_seconds / self.prefill_seconds if self.prefill_seconds > 0 else math.inf

    def summary(self) -> str:
        verdict = "disaggregate" if self.disaggregate else "colocate"
        sign = "<" if self.disaggregate else ">="
        link = "NVLink" if self.kv_path == "NVLink" else f"RDMA over {self.lanes} NIC(s)"
        return (
            f"{self.model} on {self.topology}, {self.prompt_tokens}-token prompt: "
            f"KV {self.kv_bytes / 1e9:.2f} GB over {link} takes {self.transfer_seconds * 1e3:.1f} ms "
            f"{sign} {self.stall_seconds * 1e3:.1f} ms decode stall "
            f"(prefill {self.prefill_seconds * 1e3:.1f} ms, "
            f"transfer {100 * self.transfer_over_prefill:.1f}% of it): {verdict}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "topology": self.topology,
            "prompt_tokens": self.prompt_tokens,
            "gpus_per_replica": self.gpus_per_replica,
            "kv_bytes": self.kv_bytes,
            "kv_path": self.kv_path,
            "lanes": self.lanes,
            "transfer_seconds": self.transfer_seconds,
            "prefill_seconds": self.prefill_seconds,
            "stall_seconds": self.stall_seconds,
            "transfer_over_prefill": self.transfer_over_prefill,
            "disaggregate": self.disaggregate,
            "summary": self.summary(),
        }


def _check_replica(gpus_per_replica: int, topo: Topology) -> None:
    if gpus_per_replica < 1:
        raise ValueError(f"gpus_per_replica must be >= 1, got {gpus_per_replica}")
    limit = topo.max_replica_gpus
    if gpus_per_replica > limit:
        raise ValueError(f"gpus_per_replica={gpus_per_replica} does not fit {topo.name} (at most {limit})")


def _model(model: str | ModelSpec) -> ModelSpec:
    """A catalog name, or a shape already resolved (a model sized from its config.json)."""
    return model if isinstance(model, ModelSpec) else resolve_model(model)


def break_even(
    model: str | ModelSpec,
    topology: str,
    prompt_tokens: int,
    gpus_per_replica: int = 8,
    kv_bytes_per_token: int | None = None,
    dp_attention: bool = False,
) -> BreakEven:
    """Whether disaggregating `model` on `topology` pays for a `prompt_tokens`-token prompt.

    Both pools use `gpus_per_replica` GPUs with that tensor-parallel size; the KV path is the
    one the operator's placement gives (RDMA across HGX nodes, NVLink inside an NVL72 clique).
    Raises UnknownModelError / UnknownTopologyError / ValueError for bad input.
    """
    spec = _model(model)
    topo = resolve_topology(topology)
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    _check_replica(gpus_per_replica, topo)
    tp = gpus_per_replica
    path = topo.cross_pool_path
    lanes = handoff_lanes(spec, tp, tp, dp_attention)
    size = kv_bytes(spec, prompt_tokens, kv_bytes_per_token)
    transfer = handoff_seconds(size, path, topo.gpu, lanes)
    stall = stall_seconds(spec, topo.gpu, prompt_tokens, tp)
    return BreakEven(
        model=spec.key,
        topology=topo.name,
        prompt_tokens=prompt_tokens,
        gpus_per_replica=gpus_per_replica,
        kv_bytes=size,
        kv_path=path,
        lanes=lanes,
        transfer_seconds=transfer,
        prefill_seconds=prefill_seconds(spec, topo.gpu, prompt_tokens, 0, tp),
        stall_seconds=stall,
        disaggregate=transfer < stall,
    )


@dataclass(frozen=True, slots=True)
class XpydSuggestion:
    """Replica counts for a target request rate, and the per-replica capacities behind them."""

    prefill_replicas: int
    decode_replicas: int
    decode_batch: int
    prefill_rps_per_replica: float
    decode_rps_per_replica: float

    @property
    def label(self) -> str:
        return f"{self.prefill_replicas}P{self.decode_replicas}D"


def kv_capacity_tokens(model: str | ModelSpec, topology: str, gpus_per_replica: int) -> int:
    """Tokens of KV cache one replica holds after weights (vLLM's 0.9 memory utilisation); the HBM
    left per GPU is the fits-check's (`xpyd_perf.fits`), counted over the replica's GPUs."""
    spec = _model(model)
    topo = resolve_topology(topology)
    fit = replica_fit(spec, topo.gpu, gpus_per_replica)
    free = fit.kv_room_bytes_per_gpu * gpus_per_replica
    return max(0, int(free // spec.kv_bytes_per_token))


def suggest_xpyd(
    model: str | ModelSpec,
    topology: str,
    prompt_tokens: int,
    output_tokens: int,
    rate: float,
    gpus_per_replica: int = 8,
    itl_target_seconds: float = 0.05,
    cached_fraction: float = 0.0,
    utilization: float = 0.8,
    max_batch: int = 256,
) -> XpydSuggestion:
    """Prefill and decode replicas that serve `rate` requests/s at `utilization` of capacity.

    Prefill is compute-bound: one replica serves 1 / prefill time prompts per second. Decode
    runs the largest batch (at most `max_batch`, vLLM's --max-num-seqs) whose step stays under the
    inter-token target and whose KV fits.
    """
    spec = _model(model)
    topo = resolve_topology(topology)
    if rate <= 0 or output_tokens < 1 or prompt_tokens < 1:
        raise ValueError("rate, prompt_tokens and output_tokens must be positive")
    tp = gpus_per_replica
    cached = int(prompt_tokens * min(max(cached_fraction, 0.0), 1.0))
    prefill_rps = 1.0 / max(prefill_seconds(spec, topo.gpu, prompt_tokens, cached, tp), 1e-9)
    context = prompt_tokens + output_tokens // 2
    fits = max(1, kv_capacity_tokens(spec, topo.name, tp) // (prompt_tokens + output_tokens))
    lo, hi = 1, max(1, min(max_batch, fits))
    while lo < hi:  # largest batch with step <= target (step time grows with batch)
        mid = (lo + hi + 1) // 2
        if decode_step_seconds(spec, topo.gpu, mid, context, tp) <= itl_target_seconds:
            lo = mid
        else:
            hi = mid - 1
    batch = lo
    step = decode_step_seconds(spec, topo.gpu, batch, context, tp)
    decode_rps = batch / (step * output_tokens)
    return XpydSuggestion(
        prefill_replicas=max(1, math.ceil(rate / (prefill_rps * utilization))),
        decode_replicas=max(1, math.ceil(rate / (decode_rps * utilization))),
        decode_batch=batch,
        prefill_rps_per_replica=prefill_rps,
        decode_rps_per_replica=decode_rps,
    )
