"""The autoscaler's own Prometheus metrics (xpyd_ prefix), exported by the operator process."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from xpyd_api import metric_names as names

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
)


class AutoscalerMetrics:
    """Desired vs actual replicas per pool, the reason of the last decision, health and scale events."""

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

    def record(
        self,
        namespace: str,
        deployment: str,
        decision: Decision,
        current: Mapping[str, int],
        ready: Mapping[str, int],
    ) -> None:
        self.healthy.labels(namespace, deployment).set(1 if decision.healthy else 0)
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

    def _pool(self, ns: str, dep: str, role: str, d: PoolDecision, current: int, ready: int) -> None:
        self.desired.labels(ns, dep, role).set(d.desired)
        self.actual.labels(ns, dep, role).set(ready)
        for reason in REASONS:
            self.reason.labels(ns, dep, role, reason).set(1 if reason == d.reason else 0)
        if d.desired != current:
            direction = "up" if d.desired > current else "down"
            self.scale_events.labels(ns, dep, role, direction).inc()


_DEFAULT: AutoscalerMetrics | None = None


def default_metrics() -> AutoscalerMetrics:
    """The process-wide instance on prometheus_client's default registry (created once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AutoscalerMetrics()
    return _DEFAULT
