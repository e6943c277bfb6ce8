"""The reconciler's own Prometheus metrics: API writes by verb and kind, reconcile counts and durations."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

WRITES = Counter(
    "xpyd_operator_api_writes",
    "Write calls the reconciler made to the API server",
    ["verb", "kind"],
)
RECONCILES = Counter("xpyd_operator_reconciles", "Reconcile passes by result", ["result"])
RECONCILE_SECONDS = Histogram(
    "xpyd_operator_reconcile_seconds",
    "Duration of one reconcile pass",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Expose the default registry (ours and the autoscaler's) on http://address:port/metrics."""
    start_http_server(port, addr=address)


def write(verb: str, kind: str) -> None:
    WRITES.labels(verb=verb, kind=kind).inc()
