"""The peers' autoscaling rules the xpyd policies are benchmarked against (not product code).

- ``keda``: production-stack's KEDA trigger on queued requests with HPA defaults;
- ``saturation``: a saturation rule like llm-d's variant autoscaler (KV cache < 0.8, queue < 5 per
  replica), each pool on its own;
- ``planner``: a Planner-style ``sla`` rule from Dynamo's published design: per-replica throughput
  interpolated from a profile at the TTFT/ITL targets, a load predictor, correction factors;
- ``ReactiveBound``: a reference, not a peer: about the most a policy reacting to measured load reaches.

The simulator looks policies up by name in ``xpyd_operator.autoscaling.policy.AUTOSCALERS``;
``bench.baselines.register()`` adds these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from xpyd_operator.autoscaling.guards import health, is_fresh, window_max
from xpyd_operator.autoscaling.slo import SloPolicy
from xpyd_operator.autoscaling.slomodel import ReplicaPerf, trend
from xpyd_operator.autoscaling.types import (
    PREFILL,
    Decision,
    PolicyInputs,
    PoolDecision,
    PoolObservation,
    PoolState,
)

KEDA_THRESHOLD = 5.0  # vllm:num_requests_waiting per pod, the vLLM production-stack default
HPA_TOLERANCE = 0.1
HPA_SCALE_UP_PODS = 4  # HPA's default scale-up policy: max(100 %, 4 pods) per period
SATURATION_KV = 0.8  # llm-d's variant autoscaler: KV cache usage a replica is saturated at
SATURATION_QUEUE = 5.0  # and queued requests per replica
PLANNER_INTERVAL_S = 60.0  # between two Planner adjustments (a setting of the benchmark, swept there)


class HpaRule:
    """An HPA-driven rule: a per-pool recommendation (``recommend``) moved as the HPA moves it.

    Up by at most max(100 %, 4 pods) per decision; down to the highest recommendation of the last
    ``behavior.stabilization_seconds`` (HPA's default window is 300 s) with no step limit; holds
    when the metric is missing.
    """

    name = "hpa"

    def present(self, role: str, obs: PoolObservation) -> bool:
        return obs.waiting is not None

    def recommend(self, role: str, obs: PoolObservation) -> tuple[int, str]:
        raise NotImplementedError

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        beh = inputs.behavior
        pools: dict[str, PoolDecision] = {}
        states: dict[str, PoolState] = {}
        for role, obs in inputs.pools.items():
            b, n, st = inputs.bounds[role], obs.replicas, state.get(role, PoolState())
            if not self.present(role, obs) or not is_fresh(obs, beh.stale_after_seconds, now):
                pools[role], states[role] = PoolDecision(b.clamp(n), "no-data", "metric missing: holding"), st
                continue
            rec, msg = self.recommend(role, obs)
            rec = b.clamp(rec)
            window = beh.stabilization_seconds
            recs = (*((t, r) for t, r in st.recommendations if t > now - window), (now, rec))
            desired = min(rec, n + max(n, HPA_SCALE_UP_PODS)) if rec > n else min(n, window_max(recs))
            desired = b.clamp(desired)
            reason = "scale-up" if desired > n else "scale-down" if desired < n else "hold"
            pools[role] = PoolDecision(desired, reason, msg)
            states[role] = replace(st, recommendations=recs, last_desired=desired).moved(now, n, desired)
        ok, why, text = health(inputs.pools, beh.stale_after_seconds, now, self.present)
        return Decision(pools, ok, why, text, states)


class KedaPolicy(HpaRule):
    """KEDA's Prometheus trigger on ``vllm:num_requests_waiting`` (AverageValue 5) with HPA defaults.

    desired = ceil(sum(waiting) / 5), held within 10 % tolerance, moved as HpaRule moves it.
    """

    name = "keda"

    def __init__(self, threshold: float = KEDA_THRESHOLD) -> None:
        if threshold <= 0:
            raise ValueError(f"KEDA threshold must be > 0, got {threshold}")
        self.threshold = threshold

    def recommend(self, role: str, obs: PoolObservation) -> tuple[int, str]:
        n, waiting = obs.replicas, obs.waiting or 0.0
        ratio = waiting / (max(n, 1) * self.threshold)
        rec = n if n > 0 and abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(waiting / self.threshold)
        return rec, f"{waiting:g} waiting vs {self.threshold:g}/pod"


class SaturationPolicy(HpaRule):
    """Saturation-driven like llm-d's variant autoscaler: a replica is saturated at KV usage >= 0.8 or
    >= 5 queued requests; a pool grows while saturated and shrinks while one replica fewer would not be.

    Not P/D-aware: each pool on its own signals (prefill pools, whose KV empties at handoff, grow on
    their queue). desired = max(ceil(n x kv / 0.8), ceil(waiting / 5)), at least 1, moved as HpaRule.
    """

    name = "saturation"

    def __init__(self, kv_threshold: float = SATURATION_KV, queue_threshold: float = SATURATION_QUEUE) -> None:
        if not 0 < kv_threshold <= 1 or queue_threshold <= 0:
            raise ValueError(f"saturation thresholds out of range: kv {kv_threshold}, queue {queue_threshold}")
        self.kv, self.queue = kv_threshold, queue_threshold

    def recommend(self, role: str, obs: PoolObservation) -> tuple[int, str]:
        n, waiting, kv = max(obs.replicas, 1), obs.waiting or 0.0, obs.kv_usage or 0.0
        rec = max(1, math.ceil(n * kv / self.kv - 1e-9), math.ceil(waiting / self.queue - 1e-9))
        if kv >= self.kv or waiting >= self.queue * n:
            rec = max(rec, n + 1)  # saturated at this size: at least one more
        return rec, f"KV {kv:.0%} vs {self.kv:.0%}, {waiting:g} waiting vs {self.queue:g}/replica"


@dataclass(frozen=True)
class PlannerProfile:
    """What Planner's pre-deployment profiling measures of one replica per pool, as interpolation tables.

    prefill: (prompt tokens, TTFT seconds) points; decode: per context length, (batch, ITL seconds)
    points. ``profile()`` sweeps them from a replica's step timings (in the benchmark: the simulator's).
    """

    prefill: tuple[tuple[float, float], ...]
    decode: tuple[tuple[float, tuple[tuple[float, float], ...]], ...]
    kv_capacity_tokens: int

    def prefill_throughput(self, isl: float) -> float:
        """Prompt tokens/s one prefill replica sustains at this prompt length (interpolated)."""
        xs = [x for x, _ in self.prefill]
        ttft = float(np.interp(isl, xs, [y for _, y in self.prefill]))
        return isl / max(ttft, 1e-9)

    def ttft(self, isl: float) -> float:
        return float(np.interp(isl, [x for x, _ in self.prefill], [y for _, y in self.prefill]))

    def itl(self, batch: float, context: float) -> float:
        row = min(self.decode, key=lambda r: abs(r[0] - context))[1]
        return float(np.interp(batch, [b for b, _ in row], [t for _, t in row]))

    def decode_throughput(self, itl_target: float, context: float) -> float:
        """Tokens/s one decode replica generates at the largest batch whose ITL meets the target."""
        row = min(self.decode, key=lambda r: abs(r[0] - context))[1]
        best = 0.0
        for batch, itl in row:
            if itl <= itl_target and batch * context <= self.kv_capacity_tokens:
                best = max(best, batch / itl)
        return best or row[0][0] / row[0][1]


def profile(
    prefill_seconds: Callable[[int], float],
    decode_step_seconds: Callable[[int, int], float],
    kv_capacity_tokens: int,
) -> PlannerProfile:
    """Sweep prompt lengths and (context, batch) grids through a replica's timings, as Planner's profiler does."""
    isls = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    contexts = (512, 1024, 2048, 4096, 8192, 16384)
    batches = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    pre = tuple((float(n), prefill_seconds(n)) for n in isls)
    dec = tuple((float(c), tuple((float(b), decode_step_seconds(b, b * c)) for b in batches)) for c in contexts)
    return PlannerProfile(pre, dec, kv_capacity_tokens)


def perf_profile(perf: ReplicaPerf) -> PlannerProfile:
    """The profile of a replica as the performance model prices it."""
    return profile(
        perf.prefill_seconds, lambda b, ctx: perf.decode_step_seconds(b, ctx / max(b, 1)), perf.kv_capacity_tokens
    )


class PlannerPolicy:
    """A Planner-style ``sla`` rule after Dynamo's published design (not its code).

    Every ``interval_s``: the load over the last interval (request rate, mean prompt and output
    lengths) is predicted one interval ahead (moving average plus linear trend, an ARIMA-lite);
    prefill replicas = predicted prompt tokens/s / (profiled throughput at that prompt length /
    TTFT correction); decode replicas = predicted output tokens/s / (profiled throughput at the
    largest batch whose ITL meets target / ITL correction). Corrections are observed / profiled
    latency at the current load. Sizes are set directly, within bounds; it holds on missing data.
    Profiles come from ``profile()``; without one it profiles each pool's performance model.
    """

    name = "planner"

    def __init__(
        self,
        profiles: Mapping[str, PlannerProfile] | None = None,
        interval_s: float = PLANNER_INTERVAL_S,
        headroom: float = 1.0,
    ) -> None:
        if interval_s <= 0 or headroom <= 0:
            raise ValueError(f"planner interval and headroom must be > 0, got {interval_s}, {headroom}")
        self.profiles = dict(profiles or {})
        self.interval_s = interval_s
        self.headroom = headroom

    def _profile(self, role: str, inputs: PolicyInputs) -> PlannerProfile | None:
        if role not in self.profiles and role in inputs.perf:
            self.profiles[role] = perf_profile(inputs.perf[role])
        return self.profiles.get(role)

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        beh, slo = inputs.behavior, inputs.slo
        pre = inputs.pools.get(PREFILL)
        pools: dict[str, PoolDecision] = {}
        states: dict[str, PoolState] = {}
        for role, obs in inputs.pools.items():
            b, n, st = inputs.bounds[role], obs.replicas, state.get(role, PoolState())
            prof = self._profile(role, inputs)
            load = _planner_load(pre, obs)
            if slo is None or prof is None or load is None or not is_fresh(obs, beh.stale_after_seconds, now):
                pools[role], states[role] = PoolDecision(b.clamp(n), "no-data", "load or profile missing: holding"), st
                continue
            rate, isl, osl = load
            pts = (*((t, v) for t, v in st.demand if t > now - 10 * self.interval_s), (now, rate))[-10:]
            st = replace(st, demand=pts)
            if st.fresh_since is not None and now - st.fresh_since < self.interval_s:
                pools[role], states[role] = PoolDecision(b.clamp(n), "hold", "between adjustments"), st
                continue
            predicted = max(0.0, _predict(pts, self.interval_s))
            c = st.correction or 1.0
            if role == PREFILL:
                if obs.ttft_p90 is not None and rate > 0:
                    c = _bounded(obs.ttft_p90 / max(prof.ttft(isl), 1e-9))
                capacity = prof.prefill_throughput(isl) / max(c, 1.0)
                want = predicted * isl / (capacity * self.headroom)
                msg = f"planner: {predicted:.2f} req/s x {isl:.0f} tok vs {capacity:.0f} tok/s/replica (x{c:.2f})"
            else:
                context = isl + osl / 2
                if obs.itl_p90 is not None and obs.running and obs.ready:
                    c = _bounded(obs.itl_p90 / max(prof.itl(obs.running / obs.ready, context), 1e-9))
                capacity = prof.decode_throughput(slo.itl_seconds / max(c, 1.0), context)
                want = predicted * osl / (capacity * self.headroom)
                msg = f"planner: {predicted:.2f} req/s x {osl:.0f} out tok vs {capacity:.0f} tok/s/replica (x{c:.2f})"
            desired = b.clamp(max(1, math.ceil(want - 1e-9)))
            reason = "scale-up" if desired > n else "scale-down" if desired < n else "hold"
            pools[role] = PoolDecision(desired, reason, msg)
            st = replace(st, correction=c, fresh_since=now, last_desired=desired)
            states[role] = st.moved(now, n, desired)
        ok, why, text = health(inputs.pools, beh.stale_after_seconds, now, lambda _r, o: o.waiting is not None)
        return Decision(pools, ok, why, text, states)


def _planner_load(prefill: PoolObservation | None, obs: PoolObservation) -> tuple[float, float, float] | None:
    """(requests/s, mean prompt tokens, mean output tokens) over the last interval, from the prefill pool."""
    src = prefill or obs
    if src.request_rate is None or src.prompt_tokens_rate is None:
        return None
    rate = src.request_rate
    if rate <= 0:
        return 0.0, 1024.0, 128.0
    gen = obs.generation_tokens_rate if obs is not prefill and obs.generation_tokens_rate is not None else None
    osl = (gen / rate) if gen else 128.0
    return rate, max(1.0, src.prompt_tokens_rate / rate), max(1.0, osl)


def _predict(points: Sequence[tuple[float, float]], horizon: float) -> float:
    """Moving average of the recent load plus its trend over one horizon (an ARIMA-lite predictor)."""
    values = [v for _, v in points]
    mean = sum(values[-3:]) / len(values[-3:])
    return mean + max(0.0, trend(points)) * horizon


def _bounded(correction: float) -> float:
    return min(4.0, max(0.25, correction))


class ReactiveBound(SloPolicy):
    """A reference, not a contender: the SLO policy, except that whenever it would grow a pool the pool
    goes to its bound at once. It sees a rise when the SLO policy does and then holds the most any policy
    could, so its attainment is about the most a policy that reacts to measured load reaches."""

    name = "reactive-bound"

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        d = super().decide(inputs, state, now)
        pools = {
            role: replace(dec, desired=inputs.bounds[role].max_replicas)
            if dec.desired > inputs.pools[role].replicas
            else dec
            for role, dec in d.pools.items()
        }
        states = {role: replace(st, last_desired=pools[role].desired) for role, st in d.state.items()}
        return replace(d, pools=pools, state=states)
