"""The SLO policy: size prefill and decode for spec.slo's TTFT and ITL at the fewest replicas.

Each pool's replica is priced by the performance model (slomodel) and corrected online
from the engines' own latency. Both pools are one decision over the same traffic:

- prefill from the prompt-token rate less the prefix-cache hits, plus the prompts that arrived
  unserved (the queue's growth since the last decision), at the smallest size whose TTFT at the
  planned quantile (service + queueing) fits the target less the KV handoff; the prompts priced as
  the mix they come in (classes from the prompt length's p50, p90 and p99, each waiting behind the
  mean service, then taking its own), so the long ones set TTFT's tail (the cache hits taken off as a
  share up to the mean prompt, as the mean's tokens past it; a longer p99 counted once it has held a
  minute, a shorter one at once); where no size reaches the
  quantile (prompts too long for the budget however idle the pool), at the smallest size that
  reaches the goal's share of what the pool's bound reaches;
- decode from the sequences it runs and those about to arrive (queued here and at prefill), at the
  smallest size whose decode step (the ITL) fits the target, whose KV cache holds them with
  headroom and whose batch stays under the engine's cap (the pool's --max-num-seqs, else vLLM's
  256), since sequences past it queue and wait out their TTFT; so the P:D ratio follows the mix.

Demand is extrapolated along its recent trend by the measured time to Ready, or by the span the trend
was fitted over if shorter (ahead of ramps, never below now). The prefill model's correction is learnt
from TTFT only in a steady state (all replicas Ready, no backlog now or at the last decision, no resize
within the minute the latency quantiles span); decode's likewise. Moving the sizes (up at once, down
straight to the stabilization window's maximum, cooldowns, flap guard, no move on missing data, a
manual edit taken as the new target) is XpydPolicy's, except that decode may first shrink after a few
sequence lifetimes of fresh data rather than a window (prefill holds the size the user set a whole
window), and that while bursts recur (two of comparable height within MEMORY_WINDOWS windows) the pool
keeps the highest one in memory, until the pool has been idle a whole window (the load stopped: its
bursts are forgotten). An idle pool goes to its minimum.
A pool the model cannot price is sized by XpydPolicy's thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from xpyd_api.models import SloSpec

from .policy import XpydPolicy
from .promql import PROMPT_QUANTILES
from .promql import RATE_WINDOW_S as LATENCY_WINDOW_S
from .slomodel import (
    Mix,
    ReplicaPerf,
    corrected,
    mix_mean,
    mix_quantile,
    mix_within,
    prompt_classes,
    trend,
)
from .types import (
    DECODE,
    PREFILL,
    Behavior,
    Decision,
    PolicyInputs,
    PoolBounds,
    PoolDecision,
    PoolObservation,
    PoolState,
)

DEFAULT_READY_S: Final = 60.0  # a new replica's time to Ready until one is measured
READY_ALPHA: Final = 0.5
MAX_UTILIZATION: Final = 0.9  # a prefill pool is never planned fuller than this
KV_HEADROOM: Final = 0.8  # decode KV cache planned at most this full (sequences still grow)
BATCH_HEADROOM: Final = 0.9
TTFT_MARGIN: Final = 1.0  # plan TTFT this far under its target
ITL_MARGIN: Final = 0.9  # plan the decode step this far under the ITL target (replica imbalance)
OBSERVED_Q: Final = 0.9  # the quantile the engines' latency is scraped at (p90)
DEMAND_POINTS: Final = 12  # demand samples kept for the trend
DEFAULT_PROMPT: Final = 2048.0
SETTLE_S: Final = 60.0  # fresh data decode needs at most before its first scale-down (prefill: a window)
LIFETIMES: Final = 3.0  # sequence lifetimes for decode's gauges to settle (a transient decays to e^-3)
GROWTH: Final = 1.3  # context a running sequence still adds, as a share of what it holds
MEMORY_WINDOWS: Final = 4.0  # the burst memory, in stabilization windows


def planned_quantile(slo: SloSpec) -> float:
    """The quantile the policy plans latency at: the stricter of the percentile and the attainment goal."""
    return max(slo.percentile / 100.0, slo.attainment)


def mean_prompt(obs: PoolObservation) -> float:
    if obs.prompt_tokens_rate and obs.request_rate and obs.request_rate > 0:
        return obs.prompt_tokens_rate / obs.request_rate
    return DEFAULT_PROMPT


def prefill_ttft(
    perf: ReplicaPerf, correction: float, prompts: Mix, rate_tokens: float, n: int, q: float, capacity: float
) -> tuple[float, float, float]:
    """(TTFT at quantile q, mean service seconds, utilization) of `n` replicas computing `rate_tokens`/s of
    prompts `prompts` ((share, new tokens) classes).

    The correction scales latency (service time); throughput is `capacity` tokens/s per replica.
    """
    mix = services(perf, correction, prompts)
    rho = rate_tokens / (max(n, 1) * capacity) if n > 0 else math.inf
    return mix_quantile(mix, rho, q), mix_mean(mix), rho


def services(perf: ReplicaPerf, correction: float, prompts: Mix) -> list[tuple[float, float]]:
    """(share, service seconds) of each class of prompts ((share, new tokens))."""
    return [(w, correction * perf.prefill_seconds(tokens)) for w, tokens in prompts]


def size_prefill(
    perf: ReplicaPerf,
    correction: float,
    prompts: Mix,
    rate_tokens: float,
    budget_s: float,
    q: float,
    top: int,
    capacity: float,
) -> tuple[int, float, float]:
    """The fewest replicas (up to `top`) whose TTFT at q fits `budget_s`; with that TTFT and its attainment.

    Where not even `top` replicas reach q (prompts whose own service time is near or over the budget miss
    it however idle the pool), the goal is the same share of what `top` reaches: more replicas would
    buy next to nothing.
    """
    mix = services(perf, correction, prompts)

    def rho(n: int) -> float:
        return rate_tokens / (n * capacity)

    best = mix_within(mix, rho(top), budget_s)
    floor = q if best >= q else q * best
    for n in range(1, top + 1):
        attain = mix_within(mix, rho(n), budget_s)
        if rho(n) <= MAX_UTILIZATION and attain >= floor:
            return n, mix_quantile(mix, rho(n), q), attain
    return top, mix_quantile(mix, rho(top), q), best


def one_class(new_tokens: float) -> Mix:
    """Every prompt as the mean one: the mix where no prompt-length quantile is scraped."""
    return ((1.0, new_tokens),)


def prompt_mix(obs: PoolObservation, hit: float) -> Mix:
    """The pool's prompts as (share, new tokens) classes: from the prompt-length quantiles scraped over the
    last minute where all are, else all at the mean prompt. The prefix cache's hits come off each class as
    the hit ratio's share up to the mean prompt, past it as the tokens the mean prompt hits: what a cache
    holds (a system prompt, earlier turns) does not grow with the prompt, so a long one is not planned to
    hit more than the mean, and the tail it sets is not planned shorter than it is."""
    quantiles = (obs.prompt_tokens_p50, obs.prompt_tokens_p90, obs.prompt_tokens_p99)
    if any(v is None or not v > 0 for v in quantiles):
        return one_class(mean_prompt(obs) * (1.0 - hit))
    pts = [(q, float(v or 0.0)) for q, v in zip(PROMPT_QUANTILES, quantiles, strict=True)]
    cached = hit * mean_prompt(obs)
    return [(w, max(tokens * (1.0 - hit), tokens - cached)) for w, tokens in prompt_classes(pts)]


def size_decode(
    perf: ReplicaPerf, correction: float, sequences: float, context: float, itl_s: float, top: int
) -> tuple[int, float, str]:
    """The fewest replicas (up to `top`) meeting the ITL, the KV cache and the batch cap; with its ITL and limit."""
    kv_need = sequences * context * GROWTH
    by_kv = math.ceil(kv_need / (perf.kv_capacity_tokens * KV_HEADROOM))
    by_batch = math.ceil(sequences / (perf.max_seqs * BATCH_HEADROOM))
    start = max(1, by_kv, by_batch)
    limit = "kv-cache" if by_kv > 1 and by_kv >= by_batch else "batch" if by_batch > 1 else "itl"
    for n in range(min(start, top), top + 1):
        itl = correction * perf.decode_step_seconds(sequences / n, context)
        if itl <= itl_s * ITL_MARGIN:
            return n, itl, limit if n == start else "itl"
    return top, correction * perf.decode_step_seconds(sequences / top, context), "max"


def ahead(st: PoolState, now: float, value: float, horizon: float, window: float) -> tuple[float, PoolState]:
    """`value` extrapolated along its recent upward trend by `horizon` seconds, or by as long as the trend
    was fitted over if that is shorter (a line through a few samples says little further out); the state
    keeps the sample."""
    pts = (*((t, v) for t, v in st.demand if t > now - window), (now, value))[-DEMAND_POINTS:]
    slope = max(0.0, trend(pts))
    return value + slope * min(horizon, now - pts[0][0]), replace(st, demand=pts)


def steady_tail(st: PoolState, now: float, p99: float | None) -> tuple[float | None, PoolState]:
    """The prompt-length p99 to plan with: the lowest scraped over the last LATENCY_WINDOW_S, this one
    included, so a longer tail buys replicas once it has held for a minute of scrapes and a shorter one
    acts at once. vLLM's prompt histogram has wide top buckets (20,000 to 50,000 tokens, ...): a few long
    prompts in a minute move its interpolated p99 by half, and the p99 class, priced near the TTFT budget,
    would size the pool on them. The state keeps the sample (None, not scraped, keeps nothing)."""
    kept = tuple((t, v) for t, v in st.tails if t > now - LATENCY_WINDOW_S)
    if p99 is None:
        return None, replace(st, tails=kept)
    return min((p99, *(v for _, v in kept))), replace(st, tails=(*kept, (now, p99)))


def queue_growth(st: PoolState, now: float, waiting: float) -> tuple[float, PoolState]:
    """Requests/s the queue grew by since the last decision (0 if it shrank, or on the first sample):
    arrivals the pool did not serve, so its served rate does not show them; the state keeps the sample."""
    prev, rate = st.queue, 0.0
    if prev is not None and now > prev[0]:
        rate = max(0.0, (waiting - prev[1]) / (now - prev[0]))
    return rate, replace(st, queue=(now, waiting))


def remember(needs: Sequence[tuple[float, int]], now: float, need: int, memory: float) -> tuple[tuple[float, int], ...]:
    """The burst memory after `need` was asked for at `now`: the times the size asked for changed, those of
    the last `memory` seconds and the one in force when it begins (so a rise within it is seen as one)."""
    out = list(needs) if needs and needs[-1][1] == need else [*needs, (now, need)]
    old = [i for i, (t, _) in enumerate(out) if t <= now - memory]
    return tuple(out[old[-1] :] if old else out)


def bursts(needs: Sequence[tuple[float, int]]) -> list[int]:
    """The peaks of the bursts in `needs` (sizes asked for, oldest first): each a run of sizes above the
    lowest one, begun by a rise from it (a run already above it when the memory begins is not one: its
    start is not seen)."""
    if not needs:
        return []
    base = min(n for _, n in needs)
    peaks: list[int] = []
    inside = seen_base = False
    for _, n in needs:
        if n <= base:
            inside, seen_base = False, True
        elif inside:
            peaks[-1] = max(peaks[-1], n)
        elif seen_base:
            peaks.append(n)
            inside = True
    return peaks


def burst_floor(needs: Sequence[tuple[float, int]]) -> int | None:
    """The size a pool keeps while bursts recur: the highest burst in memory, once at least two bursts of
    comparable height (at least half the highest's rise above the lowest size) were seen; None otherwise
    (a one-off transient, or no burst)."""
    peaks = bursts(needs)
    if not peaks:
        return None
    base, top = min(n for _, n in needs), max(peaks)
    comparable = [p for p in peaks if 2 * (p - base) >= top - base]
    return top if len(comparable) >= 2 else None


def sequence_lifetime(inputs: PolicyInputs) -> float:
    """Seconds a sequence stays in decode: Little's law (sequences running / requests per second through
    prefill) while some run; else the tokens a request generates (decode's generated tokens / requests)
    times decode's ITL, all measured over the same minute (sequences too short to be caught running at a
    scrape still show there); infinite where neither is measured."""
    decode, prefill = inputs.pools.get(DECODE), inputs.pools.get(PREFILL)
    if decode is None:
        return math.inf
    rate = prefill.request_rate if prefill is not None else None
    if decode.running is not None and decode.running >= 1 and rate and rate > 0:
        return decode.running / rate
    tokens, done, itl = decode.generation_tokens_rate, decode.request_rate, decode.itl_p90
    if tokens and done and itl and tokens > 0 and done > 0 and itl > 0:
        return tokens / done * itl
    return math.inf


def quiet(st: PoolState, now: float, is_idle: bool, window: float) -> PoolState:
    """The state after a decision that found the pool idle (`is_idle`: nothing to do) or not: since when it
    has been, and, after a whole `window` of it, no burst memory (the load stopped and its bursts with it;
    the memory starts anew). A lull between requests shorter than the window forgets nothing."""
    if not is_idle:
        return replace(st, idle_since=None)
    since = st.idle_since if st.idle_since is not None else now
    return replace(st, idle_since=since, needs=() if now - since >= window else st.needs)


def idle(obs: PoolObservation) -> bool:
    """Whether a pool has nothing to do: none running, none queued, none held in the router for a worker."""
    return not obs.running and not obs.waiting and not obs.held


def settled(st: PoolState, now: float, ready_s: float) -> bool:
    """Whether the latency quantiles scraped now (over the last LATENCY_WINDOW_S) are all of the pool's current
    size: its last resize, and a new replica's time to Ready (`ready_s`) after it, are older than the window."""
    return st.last_scale_time is None or now - st.last_scale_time >= LATENCY_WINDOW_S + ready_s


def latency(seconds: float) -> str:
    """A planned latency for a message: a queue that grows without bound (demand over capacity) has none."""
    return f"{seconds:.2f}s" if math.isfinite(seconds) else "unbounded (demand over capacity)"


def learnt(correction: float, attainment: float, ready_s: float) -> str:
    """What the policy has learnt so far, as its messages say it."""
    return f"correction x{correction:.2f}; predicted attainment {attainment:.1%}; ready in ~{ready_s:.0f}s"


def measure_ready(obs: PoolObservation, st: PoolState, now: float) -> PoolState:
    """Learn the time to Ready: from the decision that grew the pool to the moment all are Ready."""
    if st.pending_since is not None and obs.ready >= obs.replicas:
        sample = now - st.pending_since
        prev = st.ready_seconds
        value = sample if prev is None else (1 - READY_ALPHA) * prev + READY_ALPHA * sample
        return replace(st, ready_seconds=value, pending_since=None)
    return st


class SloPolicy(XpydPolicy):
    """Meets spec.slo at the fewest replicas; XpydPolicy's thresholds where the SLO or the model is absent."""

    name = "slo"

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        decision = super().decide(inputs, state, now)
        states = dict(decision.state)
        for role, dec in decision.pools.items():
            st, obs = states[role], inputs.pools[role]
            if dec.desired > obs.ready and st.pending_since is None:
                states[role] = replace(st, pending_since=now)
        return replace(decision, state=states)

    def _down(
        self, b: PoolBounds, n: int, st: PoolState, why: str, now: float, beh: Behavior, settle_s: float
    ) -> PoolDecision:
        # The model sized every recommendation in the window for its demand: down to the window's max at once
        # (as HPA moves), not in fractions, or the pool pays for replicas no recommendation asked for. A
        # burst's capacity is held for the window (the first of a series looks like a one-off until the next
        # comes), and while bursts recur, not below the highest one in memory: the next one would find the
        # pool short.
        floor = burst_floor(st.needs)
        if floor is not None:
            st = replace(st, recommendations=(*st.recommendations, (now, floor)))
            why = f"{why}; bursts recur, up to {floor}"
        return super()._down(b, n, st, why, now, replace(beh, scale_down_max_fraction=1.0), settle_s)

    def _remember(self, role: str, inputs: PolicyInputs, st: PoolState, need: int, now: float) -> PoolState:
        """Keep `need` in the burst memory (the sizes asked for over MEMORY_WINDOWS windows)."""
        memory = MEMORY_WINDOWS * inputs.behavior.stabilization_seconds
        return replace(st, needs=remember(st.needs, now, inputs.bounds[role].clamp(need), memory))

    def _settle_seconds(self, role: str, inputs: PolicyInputs) -> float:
        # Prefill is sized from arrivals, and the first minutes of a load say little of its bursts (the next
        # may come after quiet minutes), so the size the user set holds a whole window, as in the threshold
        # policy, until the burst memory has history. Decode is sized from what it holds (sequences, KV),
        # whose gauges settle within a few sequence lifetimes (Little's law: running / requests per second),
        # so it waits that long, SETTLE_S at most (and where the lifetime is not measured).
        window = inputs.behavior.stabilization_seconds
        if role == PREFILL:
            return window
        return min(window, SETTLE_S, LIFETIMES * sequence_lifetime(inputs))

    def _breached(self, role: str, obs: PoolObservation, inputs: PolicyInputs) -> bool:
        slo = inputs.slo
        if slo is None or role not in inputs.perf:
            return super()._breached(role, obs, inputs)
        if role == DECODE:
            return obs.itl_p90 is not None and obs.itl_p90 > slo.itl_seconds
        return obs.ttft_p90 is not None and obs.ttft_p90 > slo.ttft_seconds and (obs.waiting or 0) > 0

    def _recommend(
        self, role: str, obs: PoolObservation, inputs: PolicyInputs, st: PoolState, now: float
    ) -> tuple[int, str, PoolState]:
        slo, perf = inputs.slo, inputs.perf.get(role)
        if slo is None or perf is None or role not in (PREFILL, DECODE):
            return super()._recommend(role, obs, inputs, st, now)
        st = measure_ready(obs, st, now)
        if role == PREFILL:
            need, msg, st = self._prefill(obs, inputs, perf, slo, st, now)
        else:
            need, msg, st = self._decode(obs, inputs, perf, slo, st, now)
        st = quiet(st, now, is_idle=need == 0, window=inputs.behavior.stabilization_seconds)
        return need, msg, self._remember(role, inputs, st, need, now)

    def _prefill(
        self, obs: PoolObservation, inputs: PolicyInputs, perf: ReplicaPerf, slo: SloSpec, st: PoolState, now: float
    ) -> tuple[int, str, PoolState]:
        n = obs.replicas
        if obs.prompt_tokens_rate is None:
            return n, "slo: prompt-token rate missing: holding", st
        hit = min(1.0, max(0.0, obs.prefix_hit_ratio or 0.0))
        prompt = mean_prompt(obs)
        tail, st = steady_tail(st, now, obs.prompt_tokens_p99)
        seen = replace(obs, prompt_tokens_p99=tail)  # the prompt mix planned with
        prompts = prompt_mix(seen, hit)
        new_tokens = prompt * (1.0 - hit)
        rate = obs.prompt_tokens_rate * (1.0 - hit)
        c = st.correction or 1.0
        capacity = perf.prefill_tokens_per_second()
        waiting = obs.waiting or 0.0
        ready_s = st.ready_seconds or DEFAULT_READY_S
        # learnt in a steady state only: while replicas start or a backlog drains, TTFT is the backlog's
        # wait, which says nothing of the model's error (and would inflate it for long after). The TTFT
        # scraped now is of the requests that finished over the last minute: all at this size, no backlog at
        # the last decision either
        before = st.queue[1] if st.queue is not None else 0.0
        steady = obs.ready >= obs.replicas and max(waiting, before) <= obs.ready and settled(st, now, ready_s)
        if obs.ready and obs.ttft_p90 is not None and steady:
            predicted, _, rho = prefill_ttft(perf, c, prompts, rate, obs.ready, OBSERVED_Q, capacity)
            if rho >= 0.05 and math.isfinite(predicted):
                c = corrected(st.correction, obs.ttft_p90, predicted / c) or 1.0
        growth, st = queue_growth(st, now, waiting)
        # served prompts plus those that arrived unserved (the queue's growth). The queue itself is not
        # demand for new replicas: a queued request waits at the replica it was sent to, and a new one
        # takes new arrivals, not that queue
        arrived = rate + growth * new_tokens
        demand, st = ahead(st, now, arrived, ready_s, inputs.behavior.stabilization_seconds)
        handoff = inputs.perf[DECODE].handoff_seconds(prompt) if DECODE in inputs.perf else 0.0
        budget = slo.ttft_seconds * TTFT_MARGIN - handoff
        q = planned_quantile(slo)
        top = inputs.bounds[PREFILL].max_replicas
        need, ttft, attain = size_prefill(perf, c, prompts, demand, budget, q, top, capacity)
        if idle(obs) and demand <= 0:
            need = 0  # no prompt to compute: the pool's minReplicas (0 lets it go to zero; held requests wake it)
        st = replace(st, correction=c, predicted=round(attain, 4))
        lengths = (
            f"prompts p50/p99 {seen.prompt_tokens_p50:.0f}/{seen.prompt_tokens_p99:.0f} tok"
            if len(prompts) > 1
            else f"prompts ~{prompt:.0f} tok"
        )
        msg = (
            f"slo: {obs.prompt_tokens_rate:.0f} prompt tok/s, {lengths}, hit {hit:.0%}, demand {demand:.0f} tok/s"
            f" -> {need} (TTFT p{q * 100:g} {latency(ttft)} of {budget:.2f}s budget; {learnt(c, attain, ready_s)})"
        )
        return need, msg, st

    def _decode(
        self, obs: PoolObservation, inputs: PolicyInputs, perf: ReplicaPerf, slo: SloSpec, st: PoolState, now: float
    ) -> tuple[int, str, PoolState]:
        n = obs.replicas
        if obs.running is None or obs.kv_usage is None:
            return n, "slo: running sequences or KV usage missing: holding", st
        prefill = inputs.pools.get(PREFILL)
        ready_s = st.ready_seconds or DEFAULT_READY_S
        # prompts queued at prefill arrive here once prefill catches up: counted up to doubling what runs
        upstream = min((prefill.waiting or 0.0) if prefill is not None else 0.0, max(obs.running, 1.0))
        sequences = obs.running + (obs.waiting or 0.0)
        held = obs.kv_usage * max(obs.ready, 1) * perf.kv_capacity_tokens
        context = held / obs.running if obs.running >= 1 else DEFAULT_PROMPT
        c = st.correction or 1.0
        if obs.ready and obs.itl_p90 is not None and obs.running >= obs.ready and settled(st, now, ready_s):
            predicted = perf.decode_step_seconds(obs.running / obs.ready, context)
            c = corrected(st.correction, obs.itl_p90, predicted) or 1.0
        demand, st = ahead(st, now, sequences + upstream, ready_s, inputs.behavior.stabilization_seconds)
        top = inputs.bounds[DECODE].max_replicas
        need, itl, limit = size_decode(perf, c, demand, context, slo.itl_seconds, top)
        if idle(obs) and demand <= 0 and (prefill is None or (idle(prefill) and not prefill.prompt_tokens_rate)):
            need, limit = 0, "idle"  # nothing to decode, nothing on its way: the pool's minReplicas
        attain = 1.0 if itl <= slo.itl_seconds else slo.itl_seconds / itl
        st = replace(st, correction=c, predicted=round(attain, 4))
        msg = (
            f"slo: {obs.running:g} running + {upstream + (obs.waiting or 0):g} arriving, ~{context:.0f} tok each,"
            f" demand {demand:.0f} -> {need} by {limit} (ITL {itl * 1000:.1f}ms of {slo.itl_seconds * 1000:g}ms;"
            f" {learnt(c, attain, ready_s)})"
        )
        return need, msg, st
