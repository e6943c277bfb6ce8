"""Feeds the operator's real autoscaling policies with what Prometheus would see of the simulated pools."""

from __future__ import annotations

from typing import Any

from xpyd_operator.autoscaling_baselines import AUTOSCALERS, make_policy
from xpyd_operator.autoscaling_prometheus import PoolMetrics
from xpyd_operator.autoscaling_spec import TARGET_KEYS, PoolRuntime, policy_inputs
from xpyd_operator.autoscaling_types import PoolObservation, PoolState
from xpyd_sim.cluster import Cluster
from xpyd_sim.metrics import Histogram, Slo

# CLI spellings -> the operator's registry names.
ALIASES = {"on": "xpyd", "xpyd": "xpyd", "keda": "keda", "off": "off", "static": "off"}


def scaler_names() -> list[str]:
    return sorted(set(ALIASES) | set(AUTOSCALERS))


class SimScaler:
    """One autoscaler loop: observe each pool over the last interval, ask the policy, keep its state."""

    def __init__(
        self, name: str, cluster: Cluster, slo: Slo, interval_s: float, targets: dict[str, float] | None = None
    ) -> None:
        if name not in ALIASES:
            raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(sorted(ALIASES))}")
        unknown = set(targets or {}) - set(TARGET_KEYS)
        if unknown:
            raise ValueError(f"unknown spec.autoscaling.targets keys {sorted(unknown)}; known: {sorted(TARGET_KEYS)}")
        self.name = ALIASES[name]
        self.policy = make_policy(self.name)
        self.cluster = cluster
        # The spec as the operator's autoscaler reads it (its own translation to bounds, targets and
        # behaviour), with the simulation's SLO as the policy's SLO targets.
        self.raw_spec: dict[str, Any] = {
            "autoscaling": {
                "enabled": True,
                "intervalSeconds": interval_s,
                "targets": {"ttftP90Seconds": slo.ttft_s, "itlP90Seconds": slo.itl_s, **(targets or {})},
            }
        }
        for role, p in cluster.spec.pools.items():
            self.raw_spec[role] = {
                "replicas": p.replicas,
                "gpusPerReplica": p.gpus,
                "autoscaling": {"minReplicas": p.min_replicas, "maxReplicas": max(p.max_replicas, 1)},
            }
        self.state: dict[str, PoolState] = {}
        self.ttft_window: dict[str, list[float]] = {role: [] for role in cluster.spec.pools}
        self._itl_marks: dict[str, list[int]] = {}
        self._prompt_marks: dict[str, int] = {}
        self._last = 0.0

    def observe(self, now: float, itl: dict[str, Histogram]) -> dict[str, PoolObservation]:
        out: dict[str, PoolObservation] = {}
        span = max(now - self._last, 1e-9)
        for role, workers in self.cluster.workers.items():
            ready = [w for w in workers if w.state == "ready"]
            live = [w for w in workers if w.state in ("ready", "draining")]
            prompt = sum(w.stats[0] for w in self.cluster.all_workers() if w.role == role)
            rate = (prompt - self._prompt_marks.get(role, 0)) / span
            self._prompt_marks[role] = prompt
            ttfts = sorted(self.ttft_window[role])
            self.ttft_window[role] = []
            hist = itl.get(role)
            itl_p90 = None
            if hist is not None:
                itl_p90 = hist.quantile_since(0.9, self._itl_marks.get(role))
                self._itl_marks[role] = list(hist.counts)
            out[role] = PoolObservation(
                replicas=self.cluster.replicas(role),
                ready=len(ready),
                waiting=float(sum(w.queued for w in live)),
                running=float(sum(w.busy for w in live)),
                kv_usage=min(1.0, sum(w.kv_usage for w in ready) / len(ready)) if ready else None,
                ttft_p90=ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
                itl_p90=itl_p90,
                prompt_tokens_rate=rate,
                reporting=len(ready),
                sampled_at=now,
            )
        self._last = now
        return out

    def decide(self, now: float, itl: dict[str, Histogram]) -> dict[str, tuple[int, str]]:
        """Desired replicas per pool with the policy's reason."""
        observed = self.observe(now, itl)
        runtimes = {role: PoolRuntime(o.replicas, o.ready, 0) for role, o in observed.items()}
        metrics = {
            role: PoolMetrics(
                o.waiting, o.running, o.kv_usage, o.ttft_p90, o.itl_p90, o.prompt_tokens_rate, o.reporting, o.sampled_at
            )
            for role, o in observed.items()
        }
        inputs = policy_inputs(self.raw_spec, runtimes, metrics)
        decision = self.policy.decide(inputs, self.state, now)
        self.state = dict(decision.state)
        return {role: (d.desired, d.reason) for role, d in decision.pools.items()}
