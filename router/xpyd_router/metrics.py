"""The router's own Prometheus series (xpyd_router_*), all labelled by deployment."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    def __init__(self, deployment: str, registry: CollectorRegistry | None = None) -> None:
        self.deployment = deployment
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "xpyd_router_requests", "Client requests by endpoint and status code.",
            ["deployment", "endpoint", "code"], registry=r,
        )  # fmt: skip
        self.hop_latency = Histogram(
            "xpyd_router_hop_latency_seconds",
            "Per-hop latency: prefill (whole hop), decode_first_byte, decode (whole hop), direct.",
            ["deployment", "hop"], buckets=_HOP_BUCKETS, registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "xpyd_router_decisions", "Routing decisions by role and reason.",
            ["deployment", "role", "reason"], registry=r,
        )  # fmt: skip
        self.prefix_blocks = Counter(
            "xpyd_router_prompt_blocks", "Prompt blocks routed, by whether the index expected a cache hit.",
            ["deployment", "cached"], registry=r,
        )  # fmt: skip
        self.prefix_hit_ratio = Gauge(
            "xpyd_router_prefix_hit_ratio", "Estimated prefix cache hit ratio of routed prompt blocks.",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.handoffs = Counter(
            "xpyd_router_kv_handoffs", "Prefill-to-decode KV handoffs by path.",
            ["deployment", "path"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "xpyd_router_errors", "Errors by kind.", ["deployment", "kind"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "xpyd_router_retries", "Hops retried on another worker.", ["deployment", "hop"], registry=r,
        )  # fmt: skip
        self.workers = Gauge(
            "xpyd_router_workers", "Workers known, by role and state.",
            ["deployment", "role", "state"], registry=r,
        )  # fmt: skip
        self.inflight = Gauge(
            "xpyd_router_inflight_requests", "Client requests in flight.", ["deployment"], registry=r,
        )  # fmt: skip
        self._hits = 0
        self._blocks = 0
        # Bound children by label values: labels() costs microseconds on every request otherwise.
        self._hops: dict[str, Histogram] = {}
        self._decisions: dict[tuple[str, str], Counter] = {}
        self._requests: dict[tuple[str, int], Counter] = {}
        self._handoffs: dict[str, Counter] = {}
        self._cached = self.prefix_blocks.labels(deployment, "true")
        self._uncached = self.prefix_blocks.labels(deployment, "false")
        self._ratio = self.prefix_hit_ratio.labels(deployment)
        self.inflight_now = self.inflight.labels(deployment)

    def hop(self, hop: str, seconds: float) -> None:
        child = self._hops.get(hop)
        if child is None:
            child = self._hops[hop] = self.hop_latency.labels(self.deployment, hop)
        child.observe(seconds)

    def decision(self, role: str, reason: str) -> None:
        child = self._decisions.get((role, reason))
        if child is None:
            child = self._decisions[role, reason] = self.decisions.labels(self.deployment, role, reason)
        child.inc()

    def request(self, endpoint: str, code: int) -> None:
        child = self._requests.get((endpoint, code))
        if child is None:
            child = self.requests.labels(self.deployment, endpoint, str(code))
            self._requests[endpoint, code] = child
        child.inc()

    def handoff(self, path: str) -> None:
        child = self._handoffs.get(path)
        if child is None:
            child = self._handoffs[path] = self.handoffs.labels(self.deployment, path)
        child.inc()

    def prompt(self, blocks: int, hit: int) -> None:
        if blocks <= 0:
            return
        self._cached.inc(hit)
        self._uncached.inc(blocks - hit)
        self._hits += hit
        self._blocks += blocks
        self._ratio.set(self._hits / self._blocks)

    def error(self, kind: str) -> None:
        self.errors.labels(self.deployment, kind).inc()
