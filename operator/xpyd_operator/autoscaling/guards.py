"""The policy's guard rails: data freshness, anti-flapping, the P:D ratio band and the GPU ceiling."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping

from xpyd_api.models import RatioBand

from .types import DECODE, PREFILL, PoolBounds, PoolDecision, PoolObservation, PoolState

_EPS = 1e-9


def is_fresh(obs: PoolObservation, stale_after: float, now: float) -> bool:
    """A pool's data is fresh when its newest sample is at most ``stale_after`` seconds old."""
    return obs.sampled_at is not None and now - obs.sampled_at <= stale_after


def window_max(recommendations: Collection[tuple[float, int]]) -> int:
    """The highest recommendation kept in the stabilization window (the scale-down target)."""
    return max(r for _, r in recommendations)


def direction_change_allowed(st: PoolState, direction: int, now: float, window: float) -> bool:
    """At most one change of direction per window: a turn is refused while the last turn is younger."""
    if st.last_direction in (0, direction) or st.last_direction_change_time is None:
        return True
    return now - st.last_direction_change_time >= window


def apply_ratio_band(
    decisions: Mapping[str, PoolDecision],
    bounds: Mapping[str, PoolBounds],
    band: RatioBand | None,
    growth_blocked: Collection[str],
) -> dict[str, PoolDecision]:
    """Keep prefill/decode replicas within ``band`` by raising the pool that lags (never lowering)."""
    out = dict(decisions)
    if band is None or PREFILL not in out or DECODE not in out:
        return out
    low, high = band.min, band.max
    p, d = out[PREFILL].desired, out[DECODE].desired
    if d > 0 and p / d < low - _EPS and PREFILL not in growth_blocked:
        new_p = min(bounds[PREFILL].max_replicas, math.ceil(low * d - _EPS))
        if new_p > p:
            msg = f"P:D {p}:{d} below band {low:g}; {out[PREFILL].message}"
            out[PREFILL] = PoolDecision(new_p, "ratio-band", msg)
    p = out[PREFILL].desired
    if p > 0 and (d == 0 or p / d > high + _EPS) and DECODE not in growth_blocked:
        new_d = min(bounds[DECODE].max_replicas, math.ceil(p / high - _EPS))
        if new_d > d:
            msg = f"P:D {p}:{d} above band {high:g}; {out[DECODE].message}"
            out[DECODE] = PoolDecision(new_d, "ratio-band", msg)
    return out


def apply_gpu_ceiling(
    decisions: Mapping[str, PoolDecision],
    currents: Mapping[str, int],
    bounds: Mapping[str, PoolBounds],
    free_gpus: int | None,
) -> dict[str, PoolDecision]:
    """Trim growth to the GPUs free in the rack, one replica at a time to the least-served pool.

    GPUs a shrinking pool gives back are not counted: they are free only once its pods are gone.
    """
    out = dict(decisions)
    if free_gpus is None:
        return out
    want = {r: max(0, d.desired - currents[r]) for r, d in out.items()}
    if sum(w * bounds[r].gpus_per_replica for r, w in want.items()) <= free_gpus:
        return out
    budget = max(0, free_gpus)
    granted = dict.fromkeys(want, 0)
    while True:
        open_ = [r for r in want if granted[r] < want[r] and bounds[r].gpus_per_replica <= budget]
        if not open_:
            break
        r = min(open_, key=lambda k: ((currents[k] + granted[k]) / (currents[k] + want[k]), k))
        granted[r] += 1
        budget -= bounds[r].gpus_per_replica
    for r, w in want.items():
        if granted[r] < w:
            new = currents[r] + granted[r]
            msg = f"rack has {free_gpus} free GPUs: {new} instead of {out[r].desired}; {out[r].message}"
            out[r] = PoolDecision(new, "gpu-ceiling", msg)
    return out


def health(
    pools: Mapping[str, PoolObservation],
    stale_after: float,
    now: float,
    required_present: Callable[[str, PoolObservation], bool],
) -> tuple[bool, str, str]:
    """The AutoscalerHealthy condition (status, reason, message) from the pools' data."""
    problems: list[tuple[str, str]] = []
    for role, obs in sorted(pools.items()):
        if obs.sampled_at is None:
            problems.append(("MetricsMissing", f"{role}: no samples"))
        elif not is_fresh(obs, stale_after, now):
            problems.append(("MetricsStale", f"{role}: newest sample {now - obs.sampled_at:.0f}s old"))
        elif not required_present(role, obs):
            problems.append(("MetricsMissing", f"{role}: queue or KV metrics absent"))
        elif obs.reporting is not None and obs.reporting < obs.ready:
            problems.append(("MetricsPartial", f"{role}: {obs.reporting} of {obs.ready} ready pods report"))
    if not problems:
        return True, "MetricsFresh", "every pool has fresh metrics"
    msg = "; ".join(m for _, m in problems) + "; holding sizes (never scaling down blind)"
    return False, problems[0][0], msg
