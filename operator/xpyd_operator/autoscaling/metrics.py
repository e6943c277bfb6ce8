"""The autoscaler's own Prometheus metrics (xpyd_ prefix), exported by the operator process."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from xpyd_api import metric_names as names
from xpyd_api.models import SloSpec

from .types import Decision, PoolDecision

REASONS = (
    "scale-up",
    "scale-down",
    "hold",
    "stabilizing",
    "cooldown",
    "flap-guard",
    "pending-pods",
    "no-data",
    "bounds",
    "ratio-band",
    "gpu-ceiling",
    "static",
    "wake",
)
LATENCIES = ("ttft", "itl")  # the label of the SLO's targets


class AutoscalerMetrics:
    """Desired vs actual replicas per pool, the reason of the last decision, health, scale events and wakes,
    the stated SLO and what the SLO policy has learnt."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        labels = ["namespace", "deployment", "role"]
        self.desired = Gauge(names.AUTOSCALER_DESIRED, "Replicas the autoscaler asks for", labels, registry=registry)
        self.actual = Gauge(names.AUTOSCALER_ACTUAL, "Ready replicas of the pool", labels, registry=registry)
        self.reason = Gauge(
            names.AUTOSCALER_REASON,
            "1 for the reason of the pool's last decision, 0 for the others",
            [*labels, "reason"],
            registry=registry,
        )
        self.healthy = Gauge(
            names.AUTOSCALER_HEALTHY,
            "1 when the autoscaler saw fresh metrics for every pool",
            ["namespace", "deployment"],
            registry=registry,
        )
        # what the SLO policy has learnt, per pool
        self.slo_correction, self.slo_predicted, self.ready_seconds = (
            Gauge(name, text, labels, registry=registry)
            for name, text in (
                (names.AUTOSCALER_SLO_CORRECTION, "The SLO policy's model correction (observed / predicted latency)"),
                (names.AUTOSCALER_SLO_PREDICTED, "The SLO attainment the SLO policy predicts for its last decision"),
                (names.AUTOSCALER_READY_SECONDS, "Measured seconds from a scale-up to its replicas Ready"),
            )
        )
        self.scale_events = Counter(
            names.AUTOSCALER_SCALE_EVENTS,
            "Changes of a pool's size made by the autoscaler",
            [*labels, "direction"],
            registry=registry,
        )
        self.wakes = Counter(
            names.AUTOSCALER_WAKES,
            "Pools started from zero because the router held requests for a worker (decision reason wake)",
            labels,
            registry=registry,
        )
        # spec.slo as the SLO policy runs it (absent for a deployment without one)
        deployment = ["namespace", "deployment"]
        self.slo_target = Gauge(
            names.AUTOSCALER_SLO_TARGET,
            "spec.slo's latency target at its percentile, seconds: latency ttft (ttftSeconds) or itl (itlSeconds)",
            [*deployment, "latency"],
            registry=registry,
        )
        self.slo_percentile = Gauge(
            names.AUTOSCALER_SLO_PERCENTILE,
            "spec.slo.percentile: the percentile (90, 95 or 99) both latency targets hold at",
            deployment,
            registry=registry,
        )
        self.slo_goal = Gauge(
            names.AUTOSCALER_SLO_GOAL,
            "spec.slo.attainment: the share of requests that must meet both targets, 0..1",
            deployment,
            registry=registry,
        )

    def record(
        self,
        namespace: str,
        deployment: str,
        decision: Decision,
        current: Mapping[str, int],
        ready: Mapping[str, int],
        slo: SloSpec | None = None,
    ) -> None:
        self.healthy.labels(namespace, deployment).set(1 if decision.healthy else 0)
        self._slo(namespace, deployment, slo)
        for role, d in decision.pools.items():
            self._pool(namespace, deployment, role, d, current.get(role, 0), ready.get(role, 0))
            st = decision.state.get(role)
            learnt = (
                (self.slo_correction, st.correction if st else None),
                (self.slo_predicted, st.predicted if st else None),
                (self.ready_seconds, st.ready_seconds if st else None),
            )
            for gauge, value in learnt:
                if value is not None:
                    gauge.labels(namespace, deployment, role).set(value)

    def _slo(self, ns: str, dep: str, slo: SloSpec | None) -> None:
        """The stated SLO's series; removed when the spec no longer states one."""
        if slo is None:
            for latency in LATENCIES:
                self.slo_target.remove(ns, dep, latency)
            self.slo_percentile.remove(ns, dep)
            self.slo_goal.remove(ns, dep)
            return
        self.slo_target.labels(ns, dep, "ttft").set(slo.ttft_seconds)
        self.slo_target.labels(ns, dep, "itl").set(slo.itl_seconds)
        self.slo_percentile.labels(ns, dep).set(slo.percentile)
        self.slo_goal.labels(ns, dep).set(slo.attainment)

    def _pool(self, ns: str, dep: str, role: str, d: PoolDecision, current: int, ready: int) -> None:
        self.desired.labels(ns, dep, role).set(d.desired)
        self.actual.labels(ns, dep, role).set(ready)
        for reason in REASONS:
            self.reason.labels(ns, dep, role, reason).set(1 if reason == d.reason else 0)
        if d.desired != current:
            direction = "up" if d.desired > current else "down"
            self.scale_events.labels(ns, dep, role, direction).inc()
            if d.reason == "wake":
                self.wakes.labels(ns, dep, role).inc()


_DEFAULT: AutoscalerMetrics | None = None


def default_metrics() -> AutoscalerMetrics:
    """The process-wide instance on prometheus_client's default registry (created once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AutoscalerMetrics()
    return _DEFAULT
