"""Feeds the operator's real autoscaling policies with what Prometheus would see of the simulated pools.

The policy reads the deployment's typed spec through the operator's own translation
(`xpyd_operator.autoscaling.spec.policy_inputs`), so every field of `spec.autoscaling` (targets,
ratio band, stabilization window, staleness) and each pool's bounds act here as in the operator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from xpyd_api.metric_names import token_buckets
from xpyd_api.models import SLO_PERCENTILES, AutoscalingTargets, DisaggregatedDeploymentSpec, SloSpec
from xpyd_operator.autoscaling.policy import AUTOSCALERS, make_policy
from xpyd_operator.autoscaling.promql import PROMPT_QUANTILES, RATE_WINDOW_S
from xpyd_operator.autoscaling.spec import PoolRuntime, policy_inputs
from xpyd_operator.autoscaling.types import PoolObservation, PoolState
from xpyd_sim.cluster import Cluster
from xpyd_sim.metrics import Histogram, Slo, bucket_quantile

# vLLM's buckets for prompt lengths (capped at the model's context there; past every prompt here).
PROMPT_BUCKETS = token_buckets(10**7)
# CLI spellings beside the registry's names.
ALIASES = {"on": "xpyd", "static": "off"}
TARGET_KEYS = sorted(field.alias or name for name, field in AutoscalingTargets.model_fields.items())


def scaler_names() -> list[str]:
    return sorted(set(ALIASES) | set(AUTOSCALERS))


def scaler_spec(
    spec: DisaggregatedDeploymentSpec, slo: Slo, targets: Mapping[str, float] | None = None
) -> DisaggregatedDeploymentSpec:
    """The spec the simulated autoscaler reads: on, with the simulation's SLO as the latency targets
    the spec leaves unset, and `targets` (spec.autoscaling.targets names) over everything."""
    unknown = set(targets or {}) - set(TARGET_KEYS)
    if unknown:
        raise ValueError(f"unknown spec.autoscaling.targets keys {sorted(unknown)}; known: {TARGET_KEYS}")
    given = spec.autoscaling.targets
    chosen = given.model_dump(by_alias=True, include=given.model_fields_set)
    slo_targets = {"ttftP90Seconds": slo.ttft_s, "itlP90Seconds": slo.itl_s}
    try:
        merged = AutoscalingTargets.model_validate({**slo_targets, **chosen, **(targets or {})})
    except ValidationError as exc:
        raise ValueError(f"invalid spec.autoscaling.targets: {exc}") from exc
    scaling = spec.autoscaling.model_copy(update={"enabled": True, "targets": merged})
    return spec.model_copy(update={"autoscaling": scaling, "slo": spec.slo or slo_spec(slo)})


def slo_spec(slo: Slo) -> SloSpec:
    """The simulation's SLO as spec.slo (the SLO policy's targets), at the nearest percentile it takes."""
    percentile = min(SLO_PERCENTILES, key=lambda p: abs(p - slo.quantile * 100))
    return SloSpec(ttft_seconds=slo.ttft_s, itl_seconds=slo.itl_s, percentile=percentile)


@dataclass(frozen=True)
class Mark:
    """One observation's cumulative counters per pool (prompt tokens, prefix hits, generated tokens; the ITL
    histogram's counts) and the TTFTs and prompt lengths of the requests that finished prefill since the one
    before."""

    at: float
    tokens: dict[str, tuple[int, int, int]]
    ttfts: dict[str, list[float]]
    itl: dict[str, list[int]]
    prompts: dict[str, list[int]]


class SimScaler:
    """One autoscaler loop: observe each pool as Prometheus shows it to the operator, ask the policy, keep its state."""

    def __init__(self, name: str, cluster: Cluster, slo: Slo, targets: Mapping[str, float] | None = None) -> None:
        if name not in ALIASES and name not in AUTOSCALERS:
            raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(scaler_names())}")
        self.name = ALIASES.get(name, name)
        self.policy = make_policy(self.name)
        self.cluster = cluster
        self.spec = scaler_spec(cluster.spec.deployment, slo, targets)
        self.state: dict[str, PoolState] = {}
        self.ttft_window: dict[str, list[float]] = {role: [] for role in cluster.spec.pools}
        self.prompt_window: dict[str, list[int]] = {role: [] for role in cluster.spec.pools}
        # what each observation saw, newest last: the first one at or before the window's start is the base
        # latency quantiles and the hit ratio are taken from (the operator's rate(...[1m])); the newest one,
        # counters' rates (its irate: the chart scrapes as often as the autoscaler decides)
        self._marks: deque[Mark] = deque([Mark(0.0, {}, {}, {}, {})])

    def observe(self, now: float, itl: dict[str, Histogram]) -> dict[str, PoolObservation]:
        """Each pool now, as the operator's PromQL sees it: gauges as they are, counters' rates since the last
        observation (irate), latency and prompt-length quantiles and the prefix hit ratio over the last
        RATE_WINDOW_S (since the start, early on); prompt lengths counted into vLLM's buckets, as Prometheus's
        histogram_quantile reads them."""
        while len(self._marks) > 1 and self._marks[1].at <= now - RATE_WINDOW_S:
            self._marks.popleft()
        base, last = self._marks[0], self._marks[-1]
        span = max(now - last.at, 1e-9)
        tokens: dict[str, tuple[int, int, int]] = {}
        ttfts_now: dict[str, list[float]] = {}
        itl_marks: dict[str, list[int]] = {}
        prompts_now: dict[str, list[int]] = {}
        out: dict[str, PoolObservation] = {}
        for role, workers in self.cluster.workers.items():
            ready = [w for w in workers if w.state == "ready"]
            live = [w for w in workers if w.state in ("ready", "draining")]
            mine = [w for w in self.cluster.all_workers() if w.role == role]
            prompt, hit, generated = (sum(w.stats[i] for w in mine) for i in (0, 1, 3))
            q0, h0, _ = base.tokens.get(role, (0, 0, 0))
            q1, _, g1 = last.tokens.get(role, (0, 0, 0))
            tokens[role] = (prompt, hit, generated)
            ttfts_now[role], self.ttft_window[role] = self.ttft_window[role], []
            ttfts = sorted([t for m in list(self._marks)[1:] for t in m.ttfts.get(role, ())] + ttfts_now[role])
            prompts_now[role], self.prompt_window[role] = self.prompt_window[role], []
            prompts = [p for m in list(self._marks)[1:] for p in m.prompts.get(role, ())] + prompts_now[role]
            p50, p90, p99 = (bucket_quantile(q, prompts, PROMPT_BUCKETS) for q in PROMPT_QUANTILES)
            hist = itl.get(role)
            itl_p90 = None
            if hist is not None:
                itl_p90 = hist.quantile_since(0.9, base.itl.get(role))
                itl_marks[role] = list(hist.counts)
            out[role] = PoolObservation(
                replicas=self.cluster.replicas(role),
                ready=len(ready),
                waiting=float(sum(w.queued for w in live)),
                running=float(sum(w.busy for w in live)),
                kv_usage=min(1.0, sum(w.kv_usage for w in ready) / len(ready)) if ready else None,
                ttft_p90=ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
                itl_p90=itl_p90,
                prompt_tokens_rate=(prompt - q1) / span,
                reporting=len(ready),
                sampled_at=now,
                generation_tokens_rate=(generated - g1) / span,
                request_rate=len(ttfts_now[role]) / span,
                prefix_hit_ratio=(hit - h0) / (prompt - q0) if prompt > q0 else None,
                prompt_tokens_p50=p50,
                prompt_tokens_p90=p90,
                prompt_tokens_p99=p99,
            )
        self._marks.append(Mark(now, tokens, ttfts_now, itl_marks, prompts_now))
        return out

    def decide(self, now: float, itl: dict[str, Histogram]) -> dict[str, tuple[int, str]]:
        """Desired replicas per pool with the policy's reason."""
        observed = self.observe(now, itl)
        runtimes = {role: PoolRuntime(o.replicas, o.ready, 0) for role, o in observed.items()}
        decision = self.policy.decide(policy_inputs(self.spec, runtimes, observed), self.state, now)
        self.state = dict(decision.state)
        return {role: (d.desired, d.reason) for role, d in decision.pools.items()}
