"""The xpyd scaling policy: pure, clock passed in, so the operator and the simulator run the same code.

Per pool it turns load into a raw recommendation (the largest of its signals), then moves the
size: up at once (bounded per step), down only to the highest recommendation of the last
stabilization window, one bounded step per cooldown, and never on missing or stale data.
Across pools it keeps the prefill:decode ratio band and the rack's free GPUs as a ceiling.

A user's edit of a pool's replicas is taken as a **new target**: the edited size becomes the
current size, and the stabilization window restarts from it, so the edit holds for at least one
window before the policy may shrink it (it may grow it at once if load demands). Bounds still win.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

from .guards import (
    apply_gpu_ceiling,
    apply_ratio_band,
    direction_change_allowed,
    health,
    is_fresh,
    window_max,
)
from .types import (
    DECODE,
    PREFILL,
    WORKER,
    Behavior,
    Decision,
    Policy,
    PolicyInputs,
    PoolBounds,
    PoolDecision,
    PoolObservation,
    PoolState,
    Targets,
)

_EPS = 1e-9


def signals(role: str, obs: PoolObservation, t: Targets) -> list[tuple[str, float, str]]:
    """Each load signal as (name, replicas it asks for, fractional, and a human message)."""
    out: list[tuple[str, float, str]] = []
    n = obs.replicas
    if role in (PREFILL, WORKER):
        tgt = t.prefill_waiting_per_replica
        if obs.waiting is not None:
            out.append(("queue", obs.waiting / tgt, f"{obs.waiting:g} waiting vs {tgt:g}/replica"))
        if obs.running is not None and t.prefill_running_per_replica:
            tr = t.prefill_running_per_replica
            out.append(("running", obs.running / tr, f"{obs.running:g} running vs {tr:g}/replica"))
        cap = t.prefill_tokens_per_second_per_replica
        if obs.prompt_tokens_rate is not None and cap:
            usable = cap * t.prefill_utilization
            msg = f"{obs.prompt_tokens_rate:.0f} prompt tok/s vs {usable:.0f}/replica"
            out.append(("prompt-tokens", obs.prompt_tokens_rate / usable, msg))
        slo = t.ttft_p90_seconds
        if slo and obs.ttft_p90 is not None and obs.ttft_p90 > slo and (obs.waiting or 0) > 0:
            # one more than serve now: the quantile spans a minute, so replicas still starting (or just Ready)
            # do not show in it yet, and asking past them each interval would overshoot
            out.append(("ttft-slo", obs.ready + 1.0, f"TTFT p90 {obs.ttft_p90:.2f}s > {slo:g}s with a queue"))
    if role in (DECODE, WORKER):
        if obs.kv_usage is not None:
            kv = t.decode_kv_usage
            out.append(("kv-cache", n * obs.kv_usage / kv, f"KV usage {obs.kv_usage:.0%} vs {kv:.0%}"))
        if role == DECODE and obs.waiting is not None:
            tw = t.decode_waiting_per_replica
            out.append(("queue", obs.waiting / tw, f"{obs.waiting:g} waiting vs {tw:g}/replica"))
        if obs.running is not None and t.decode_running_per_replica:
            tr = t.decode_running_per_replica
            out.append(("running", obs.running / tr, f"{obs.running:g} running vs {tr:g}/replica"))
        slo = t.itl_p90_seconds
        if slo and obs.itl_p90 is not None and obs.itl_p90 > slo:
            out.append(("itl-slo", obs.ready + 1.0, f"ITL p90 {obs.itl_p90 * 1000:.0f}ms > {slo * 1000:g}ms"))
    return out


def required_present(role: str, obs: PoolObservation) -> bool:
    """Whether the signals a pool cannot be sized without are there."""
    if obs.waiting is None:
        return False
    return role == PREFILL or obs.kv_usage is not None


def slo_breached(role: str, obs: PoolObservation, t: Targets) -> bool:
    ttft = role in (PREFILL, WORKER) and t.ttft_p90_seconds and (obs.ttft_p90 or 0) > t.ttft_p90_seconds
    itl = role in (DECODE, WORKER) and t.itl_p90_seconds and (obs.itl_p90 or 0) > t.itl_p90_seconds
    return bool(ttft or itl)


def recommend(role: str, obs: PoolObservation, t: Targets) -> tuple[int, str]:
    """The size the load asks for (before bounds and behaviour), with the deciding signal."""
    n = obs.replicas
    best_name, best_need, best_msg = "idle", 0.0, "no load"
    for name, need, msg in signals(role, obs, t):
        if need > best_need:
            best_name, best_need, best_msg = name, need, msg
    if n < best_need <= n * (1 + t.tolerance) and n > 0:
        return n, f"{best_name}: {best_msg} (within tolerance)"
    return math.ceil(best_need - _EPS), f"{best_name}: {best_msg}"


def learn_capacity(role: str, obs: PoolObservation, capacity: float | None) -> float | None:
    """Prompt tokens/s per replica, learned while the pool is saturated (a queue of >= 1 per replica).

    A saturated pool's throughput is its capacity; this lets the policy size prefill from the
    prompt-token rate (and so shrink it without guessing) when no capacity is configured.
    """
    if role == DECODE or obs.prompt_tokens_rate is None or not obs.ready or (obs.waiting or 0) < obs.ready:
        return capacity
    sample = obs.prompt_tokens_rate / obs.ready
    if sample <= 0:
        return capacity
    return sample if capacity is None else 0.8 * capacity + 0.2 * sample


class XpydPolicy:
    """Queue- and KV-driven, fast up, calm down, blind-safe."""

    name = "xpyd"

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        decisions: dict[str, PoolDecision] = {}
        states: dict[str, PoolState] = {}
        currents: dict[str, int] = {}
        for role, obs in inputs.pools.items():
            d, s = self._decide_pool(role, obs, inputs, state.get(role, PoolState()), now)
            decisions[role], states[role], currents[role] = d, s, obs.replicas
        growth_blocked = {r for r, o in inputs.pools.items() if o.unschedulable > 0}
        decisions = apply_ratio_band(decisions, inputs.bounds, inputs.ratio_band, growth_blocked)
        decisions = apply_gpu_ceiling(decisions, currents, inputs.bounds, inputs.free_gpus)
        for role, dec in decisions.items():
            s = replace(states[role], last_desired=dec.desired)
            states[role] = s.moved(now, currents[role], dec.desired)
        ok, reason, message = health(inputs.pools, inputs.behavior.stale_after_seconds, now, required_present)
        return Decision(decisions, ok, reason, message, states)

    def _decide_pool(
        self, role: str, obs: PoolObservation, inputs: PolicyInputs, st: PoolState, now: float
    ) -> tuple[PoolDecision, PoolState]:
        b, beh = inputs.bounds[role], inputs.behavior
        n = obs.replicas
        window = beh.stabilization_seconds
        if st.last_desired is not None and st.last_desired != n:
            # A user (or another controller) resized the pool: take it as the new target.
            st = replace(st, recommendations=(), fresh_since=None)
        fresh = is_fresh(obs, beh.stale_after_seconds, now)
        if not fresh:
            st = replace(st, fresh_since=None)
            return self._bounded(b, n, n, "no-data", "metrics missing or stale: holding"), st
        complete = required_present(role, obs) and (obs.reporting is None or obs.reporting >= obs.ready)
        rec, why, st = self._recommend(role, obs, inputs, st, now)
        if not complete:
            rec, why = max(rec, n), f"{why}; metrics partial: no scale-down"
        rec = b.clamp(rec)
        recs = (*((tt, r) for tt, r in st.recommendations if tt > now - window), (now, rec))
        st = replace(st, recommendations=recs, fresh_since=st.fresh_since if st.fresh_since is not None else now)
        if rec > n:
            if obs.unschedulable > 0:
                msg = f"{obs.unschedulable} pods Pending for lack of GPUs: not growing ({why})"
                return self._bounded(b, n, n, "pending-pods", msg), st
            if not direction_change_allowed(st, +1, now, window) and not self._breached(role, obs, inputs):
                return self._bounded(b, n, n, "flap-guard", f"recently turned down: holding ({why})"), st
            step = max(beh.scale_up_max_step, n)
            return self._bounded(b, n, min(rec, n + step), "scale-up", why), st
        if rec < n:
            return self._down(b, n, st, why, now, beh, self._settle_seconds(role, inputs)), st
        return self._bounded(b, n, n, "hold", why), st

    def _recommend(
        self, role: str, obs: PoolObservation, inputs: PolicyInputs, st: PoolState, now: float
    ) -> tuple[int, str, PoolState]:
        """The raw size the load asks for, its reason, and the state with what was learnt (the policies' seam)."""
        t = inputs.targets
        st = replace(st, capacity=learn_capacity(role, obs, st.capacity))
        if t.prefill_tokens_per_second_per_replica is None and st.capacity:
            t = t.model_copy(update={"prefill_tokens_per_second_per_replica": st.capacity})
        rec, why = recommend(role, obs, t)
        return rec, why, st

    def _settle_seconds(self, role: str, inputs: PolicyInputs) -> float:
        """Unbroken fresh data a pool needs before its first scale-down after a start or a manual edit (a
        whole window: thresholds need history, and a size the user set holds that long)."""
        return inputs.behavior.stabilization_seconds

    def _breached(self, role: str, obs: PoolObservation, inputs: PolicyInputs) -> bool:
        """Whether latency is over target now (growth then skips the flap guard)."""
        return slo_breached(role, obs, inputs.targets)

    def _down(
        self, b: PoolBounds, n: int, st: PoolState, why: str, now: float, beh: Behavior, settle_s: float
    ) -> PoolDecision:
        window, cool = beh.stabilization_seconds, beh.scale_down_cooldown_seconds
        if st.fresh_since is None or now - st.fresh_since < settle_s:
            return self._bounded(b, n, n, "stabilizing", f"{why}; waiting for {settle_s:.0f}s of fresh data")
        target = window_max(st.recommendations)
        if target >= n:
            return self._bounded(b, n, n, "stabilizing", f"{why}; window max {target}")
        if not direction_change_allowed(st, -1, now, window):
            return self._bounded(b, n, n, "flap-guard", f"{why}; recently turned up")
        if st.last_scale_down_time is not None and now - st.last_scale_down_time < cool:
            ago = now - st.last_scale_down_time
            return self._bounded(b, n, n, "cooldown", f"{why}; scaled down {ago:.0f}s ago")
        step = max(1, math.floor(n * beh.scale_down_max_fraction))
        return self._bounded(b, n, max(target, n - step), "scale-down", f"{why}; window max {target}")

    @staticmethod
    def _bounded(b: PoolBounds, n: int, desired: int, reason: str, message: str) -> PoolDecision:
        clamped = b.clamp(desired)
        if clamped != desired:
            return PoolDecision(clamped, "bounds", f"{message}; bounds [{b.min_replicas}, {b.max_replicas}]")
        return PoolDecision(desired, reason, message)


class StaticPolicy:
    """Autoscaling off: every pool keeps its current size (only bounds apply)."""

    name = "off"

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision:
        pools = {
            role: PoolDecision(inputs.bounds[role].clamp(obs.replicas), "static", "autoscaling off")
            for role, obs in inputs.pools.items()
        }
        return Decision(pools, True, "AutoscalingOff", "autoscaling is off", dict(state))


# The product's policies by name; benchmarks register their peers' rules (bench/baselines) beside them.
def _slo_policy() -> Policy:
    from .slo import SloPolicy  # it builds on XpydPolicy, so it is imported when asked for

    return SloPolicy()


AUTOSCALERS: dict[str, Callable[[], Policy]] = {"xpyd": XpydPolicy, "off": StaticPolicy, "slo": _slo_policy}


def make_policy(name: str) -> Policy:
    """The policy registered under ``name``; a clear error lists the known names."""
    try:
        return AUTOSCALERS[name]()
    except KeyError:
        raise ValueError(f"unknown autoscaler {name!r}; known: {', '.join(sorted(AUTOSCALERS))}") from None
