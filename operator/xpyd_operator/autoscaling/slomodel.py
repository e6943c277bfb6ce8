"""The SLO policy's model of one replica: xpyd_perf's roofline as the prior, corrected online.

No profiling before deployment: a pool's replica is priced from the model's shape and the GPUs the
spec names (the same formulas as `xpyd plan` and the simulator), and a bounded, smoothed
correction factor (observed latency / predicted latency) pulls it towards what the engines
report. Pure arithmetic; the policy (slo) decides with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator.sizing import catalog_model, engine_flags, replica_fit_of
from xpyd_perf import GpuSpec, ModelSpec, handoff_lanes, handoff_seconds, kv_bytes, prefill_seconds, step_seconds
from xpyd_perf.hardware import RDMA

CHUNK_TOKENS: Final = 8192  # vLLM's max_num_batched_tokens: one prefill step's tokens
CORRECTION_BOUNDS: Final = (0.5, 4.0)  # the model is never believed off by more than this
CORRECTION_ALPHA: Final = 0.3  # weight of a new sample in the smoothed correction
MIN_UTILIZATION_TO_LEARN: Final = 0.05  # below it latency is noise around the idle floor
MAX_SEQS: Final = 256  # vLLM's default --max-num-seqs: a larger batch queues


@dataclass(frozen=True)
class ReplicaPerf:
    """One replica of a pool as the performance model prices it: `model` on `gpus` GPUs of `gpu`."""

    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    kv_capacity_tokens: int
    handoff_lanes: int = 1
    max_seqs: int = MAX_SEQS  # the engine's batch cap (--max-num-seqs, SGLang's --max-running-requests)

    def prefill_seconds(self, new_tokens: float) -> float:
        """Time to compute `new_tokens` prompt tokens (cache misses), in chunks of one step each."""
        tokens = max(1, int(new_tokens))
        full, rest = divmod(tokens, CHUNK_TOKENS)
        chunk = prefill_seconds(self.model, self.gpu, CHUNK_TOKENS, tp=self.gpus) if full else 0.0
        return full * chunk + (prefill_seconds(self.model, self.gpu, rest, tp=self.gpus) if rest else 0.0)

    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens/s one replica computes when its steps are full."""
        return CHUNK_TOKENS / prefill_seconds(self.model, self.gpu, CHUNK_TOKENS, tp=self.gpus)

    def decode_step_seconds(self, batch: float, context_per_seq: float) -> float:
        """One decode step of `batch` sequences of `context_per_seq` tokens each (the ITL they see)."""
        b = max(1, math.ceil(batch))
        ctx = int(b * max(1.0, context_per_seq))
        m = self.model
        attn = 4.0 * m.layers * m.q_heads * m.attn_head_dim * ctx
        return step_seconds(m, self.gpu, tp=self.gpus, tokens=b, attn_flops=attn, kv_tokens_read=ctx)

    def handoff_seconds(self, prompt_tokens: float) -> float:
        """Moving one prompt's KV cache from prefill to decode over RDMA (the worse path)."""
        return handoff_seconds(kv_bytes(self.model, int(prompt_tokens)), RDMA, self.gpu, self.handoff_lanes)


def replica_perfs(spec: DisaggregatedDeploymentSpec) -> dict[str, ReplicaPerf]:
    """Each pool's replica as priced from the spec; a pool the model cannot price (topology Any, a model
    outside the catalog without a config.json) is absent, and the policy sizes it by thresholds."""
    topology = spec.topology.hardware
    pools = spec.pools()
    out: dict[str, ReplicaPerf] = {}
    if topology is None:
        return out
    tps = [p.tp for p in pools.values()]
    for role, pool in pools.items():
        model, fit = catalog_model(spec, pool), replica_fit_of(spec, pool)
        if model is None or fit is None or not fit.fits:
            continue
        gpus = max(1, pool.gpus_per_replica)
        per_token = spec.model.kv_bytes_per_token or model.kv_bytes_per_token
        capacity = int(fit.kv_room_bytes_per_gpu * gpus // max(1, per_token))
        lanes = handoff_lanes(model, min(tps), max(tps))
        seqs = engine_flags(spec, pool).max_num_seqs or MAX_SEQS
        out[role] = ReplicaPerf(model, topology.gpu, gpus, max(1, capacity), lanes, seqs)
    return out


def corrected(previous: float | None, observed: float | None, predicted: float | None) -> float | None:
    """The correction after one sample: observed/predicted, smoothed, within CORRECTION_BOUNDS.

    A missing or non-positive sample leaves it as it was (1.0, the bare model, until one arrives).
    """
    if observed is None or predicted is None or observed <= 0 or predicted <= 0:
        return previous
    low, high = CORRECTION_BOUNDS
    sample = min(high, max(low, observed / predicted))
    value = sample if previous is None else (1 - CORRECTION_ALPHA) * previous + CORRECTION_ALPHA * sample
    return min(high, max(low, value))


def waiting_quantile(service_s: float, utilization: float, q: float) -> float:
    """The q-quantile of queueing delay before a request starts, for a server this busy.

    M/M/1 tail: P(wait > t) = rho * exp(-(1 - rho) t / S); infinite at or past saturation.
    """
    if utilization <= 0:
        return 0.0
    if utilization >= 1:
        return math.inf
    tail = 1.0 - q
    if utilization <= tail:
        return 0.0
    return service_s / (1.0 - utilization) * math.log(utilization / tail)


def wait_within(wait_s: float, service_s: float, utilization: float) -> float:
    """P(queueing delay <= wait_s) at this mean service time and utilization (the same M/M/1 tail)."""
    if wait_s < 0:
        return 0.0
    if utilization <= 0:
        return 1.0
    if utilization >= 1:
        return 0.0
    return max(0.0, 1.0 - utilization * math.exp(-(1.0 - utilization) * wait_s / service_s))


# A pool's prompts as classes of (share of requests, seconds of service): a prompt waits behind the pool's
# mean service, then takes its own; so the long ones miss a TTFT budget that the mean prompt meets.
Mix = Sequence[tuple[float, float]]
# Class edges in quantile space: tenths up to the 90th percentile, finer in the tail a TTFT goal lives in.
MIX_EDGES: Final = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 0.995, 1.0)


def prompt_classes(quantiles: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(share, prompt tokens) classes from a few quantiles of prompt length ((q, tokens), q ascending): the
    quantile function piecewise linear through them from (0, 0), its last slope carried on to q = 1; each
    class between two MIX_EDGES priced at its middle."""
    pts = [(0.0, 0.0)]
    for q, tokens in quantiles:
        pts.append((q, max(tokens, pts[-1][1])))  # histogram quantiles are monotone; guard anyway
    (q1, t1), (q2, t2) = pts[-2], pts[-1]
    if q2 < 1.0:
        pts.append((1.0, t2 + (t2 - t1) / (q2 - q1) * (1.0 - q2) if q2 > q1 else t2))

    def at(u: float) -> float:
        for (qa, ta), (qb, tb) in pairwise(pts):
            if u <= qb:
                return ta + (tb - ta) * (u - qa) / (qb - qa)
        return pts[-1][1]

    return [(hi - lo, at((lo + hi) / 2)) for lo, hi in pairwise(MIX_EDGES)]


def mix_mean(mix: Mix) -> float:
    return sum(w * s for w, s in mix)


def mix_within(mix: Mix, utilization: float, budget_s: float) -> float:
    """Share of requests of `mix` ((share, service seconds)) whose service plus queueing (behind the mix's
    mean service) fits `budget_s`."""
    mean = mix_mean(mix)
    return sum(w * wait_within(budget_s - s, mean, utilization) for w, s in mix)


def mix_quantile(mix: Mix, utilization: float, q: float) -> float:
    """The q-quantile of service plus queueing over `mix` (bisection on mix_within; exact for one class)."""
    if utilization >= 1:
        return math.inf
    lo, hi = 0.0, max(s for _, s in mix) + waiting_quantile(mix_mean(mix), utilization, q)
    for _ in range(60):
        mid = (lo + hi) / 2
        if mix_within(mix, utilization, mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi


def trend(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (per second) of (time, value) points; 0 with fewer than three."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if den <= 0 else sum((t - mt) * (v - mv) for t, v in points) / den
