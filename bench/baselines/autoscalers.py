"""A KEDA-style autoscaling rule, the peer the xpyd policy is benchmarked against (not product code).

The simulator looks policies up by name in ``xpyd_operator.autoscaling_policy.AUTOSCALERS``;
``bench.baselines.register()`` adds this one as ``keda``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from xpyd_operator.autoscaling_guards import health, is_fresh, window_max
from xpyd_operator.autoscaling_types import Decision, PolicyInputs, PoolDecision, PoolObservation, PoolState

KEDA_THRESHOLD = 5.0  # vllm:num_requests_waiting per pod, the vLLM production-stack default
HPA_TOLERANCE = 0.1
HPA_SCALE_UP_PODS = 4  # HPA's default scale-up policy: max(100 %, 4 pods) per period


def _has_waiting(_role: str, obs: PoolObservation) -> bool:
    return obs.waiting is not None


class KedaPolicy:
    """KEDA's Prometheus trigger on ``vllm:num_requests_waiting`` (AverageValue 5) with HPA defaults.

    desired = ceil(sum(waiting) / 5), held within 10 % tolerance; up by at most max(100 %, 4 pods)
    per decision; down to the highest recommendation of the last 300 s (HPA's default window, taken
    from ``behavior.stabilization_seconds``) with no step limit; holds when the metric is missing.
    """

    name = "keda"

    def __init__(self, threshold: float = KEDA_THRESHOLD) -> None:
        if threshold <= 0:
            raise ValueError(f"KEDA threshold must be > 0, got {threshold}")
        self.threshold = threshold

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        beh = inputs.behavior
        pools: dict[str, PoolDecision] = {}
        states: dict[str, PoolState] = {}
        for role, obs in inputs.pools.items():
            b, n, st = inputs.bounds[role], obs.replicas, state.get(role, PoolState())
            if obs.waiting is None or not is_fresh(obs, beh.stale_after_seconds, now):
                pools[role], states[role] = PoolDecision(b.clamp(n), "no-data", "metric missing: holding"), st
                continue
            ratio = obs.waiting / (max(n, 1) * self.threshold)
            rec = n if n > 0 and abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(obs.waiting / self.threshold)
            rec = b.clamp(rec)
            window = beh.stabilization_seconds
            recs = (*((t, r) for t, r in st.recommendations if t > now - window), (now, rec))
            desired = min(rec, n + max(n, HPA_SCALE_UP_PODS)) if rec > n else min(n, window_max(recs))
            desired = b.clamp(desired)
            reason = "scale-up" if desired > n else "scale-down" if desired < n else "hold"
            msg = f"{obs.waiting:g} waiting vs {self.threshold:g}/pod"
            pools[role] = PoolDecision(desired, reason, msg)
            states[role] = replace(st, recommendations=recs, last_desired=desired).moved(now, n, desired)
        ok, why, msg = health(inputs.pools, beh.stale_after_seconds, now, _has_waiting)
        return Decision(pools, ok, why, msg, states)
