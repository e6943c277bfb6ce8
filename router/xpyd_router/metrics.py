"""The router's own Prometheus series (xpyd_router_*), all labelled by deployment."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from xpyd_api import metric_names as names

_HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _Flush:
    """Registered before the series: a scrape first applies what the request path batched up."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        self._flush()
        return []


class EventCounts(Protocol):
    """What one worker's KV event view counted (xpyd_router.engine_view.ViewStats)."""

    batches: int
    stored: int
    removed: int
    orphans: int
    mismatched: int


class _KvEvents:
    """Each subscribed worker's KV event counts, read at scrape time (nothing per event): whether every
    engine (every data-parallel rank) is heard from, and what its events did to the index. A count
    starts over when its subscription does (Prometheus' rate() takes that as a counter reset)."""

    def __init__(self, deployment: str, views: Callable[[], Mapping[str, EventCounts]]) -> None:
        self.deployment, self.views = deployment, views

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        batches = CounterMetricFamily(
            names.ROUTER_KV_EVENT_BATCHES.removesuffix("_total"), "KV event batches received, by worker.",
            labels=["deployment", "worker"],
        )  # fmt: skip
        blocks = CounterMetricFamily(
            names.ROUTER_KV_EVENT_BLOCKS.removesuffix("_total"),
            "Blocks in KV events, by worker and outcome: stored and removed (applied to the index), orphaned "
            "(a parent never seen) and mismatched (another block size).",
            labels=["deployment", "worker", "outcome"],
        )  # fmt: skip
        for worker, stats in sorted(self.views().items()):
            batches.add_metric([self.deployment, worker], stats.batches)
            for outcome, n in (("stored", stats.stored), ("removed", stats.removed),
                               ("orphaned", stats.orphans), ("mismatched", stats.mismatched)):  # fmt: skip
                blocks.add_metric([self.deployment, worker, outcome], n)
        return [batches, blocks]


class PeerState(Protocol):
    """What the replica exchange knows (xpyd_router.loadshare.LoadShare)."""

    peers: list[str]
    routes_flowing: bool
    learnt: int


class _Peers:
    """The exchange between router replicas, read at scrape time: how many peers, whether every one
    passes on its routes, and how many of their routes this replica recorded."""

    def __init__(self, deployment: str, state: PeerState) -> None:
        self.deployment, self.state = deployment, state

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        d = [self.deployment]
        peers = GaugeMetricFamily(
            names.ROUTER_PEERS, "Other router replicas this one exchanges with.", labels=["deployment"]
        )
        peers.add_metric(d, len(self.state.peers))
        sharing = GaugeMetricFamily(
            names.ROUTER_PEERS_SHARING_ROUTES,
            "1 while every peer passes on the routes it chose, so the replicas' indexes agree; 0 with peers "
            "that send counts only (an older version, or this replica's address unknown to them: set an API key).",
            labels=["deployment"],
        )
        sharing.add_metric(d, 1 if self.state.routes_flowing else 0)
        learnt = CounterMetricFamily(
            names.ROUTER_PEER_ROUTES.removesuffix("_total"),
            "Peers' routes recorded in this replica's index (one per route and worker).", labels=["deployment"],
        )  # fmt: skip
        learnt.add_metric(d, self.state.learnt)
        return [peers, sharing, learnt]


class RouterMetrics:
    """The series; per-request counts go to plain ints (no lock each) that a scrape applies."""

    def __init__(self, deployment: str, registry: CollectorRegistry | None = None) -> None:
        self.deployment = deployment
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(_Flush(self.flush))
        self._counts: dict[tuple[str, ...], int] = {}  # (series, *labels) -> increments not applied yet
        self._hop_counts: dict[str, list[float]] = {}  # hop -> [count per bucket..., sum] not applied yet
        self.requests = Counter(
            names.ROUTER_REQUESTS, "Client requests by endpoint and status code.",
            ["deployment", "endpoint", "code"], registry=r,
        )  # fmt: skip
        self.hop_latency = Histogram(
            names.ROUTER_HOP_LATENCY,
            "Per-hop latency: prefill (whole hop), decode_first_byte, decode (whole hop), direct.",
            ["deployment", "hop"], buckets=_HOP_BUCKETS, registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            names.ROUTER_DECISIONS, "Routing decisions by role and reason.",
            ["deployment", "role", "reason"], registry=r,
        )  # fmt: skip
        self.prefix_blocks = Counter(
            names.ROUTER_PROMPT_BLOCKS, "Prompt blocks routed, by whether the index expected a cache hit.",
            ["deployment", "cached"], registry=r,
        )  # fmt: skip
        self.prefix_hit_ratio = Gauge(
            names.ROUTER_PREFIX_HIT_RATIO, "Estimated prefix cache hit ratio of routed prompt blocks.",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.handoffs = Counter(
            names.ROUTER_KV_HANDOFFS, "Prefill-to-decode KV handoffs by path.",
            ["deployment", "path"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            names.ROUTER_ERRORS, "Errors by kind.", ["deployment", "kind"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            names.ROUTER_RETRIES, "Hops retried on another worker.", ["deployment", "hop"], registry=r,
        )  # fmt: skip
        self.workers = Gauge(
            names.ROUTER_WORKERS,
            "Routing targets known (a worker, or each data-parallel rank of a vLLM replica), by role and state.",
            ["deployment", "role", "state"], registry=r,
        )  # fmt: skip
        self.inflight = Gauge(
            names.ROUTER_INFLIGHT, "Client requests in flight.", ["deployment"], registry=r,
        )  # fmt: skip
        self.tokenizer_loaded = Gauge(
            names.ROUTER_TOKENIZER_LOADED,
            "1 when prompts are keyed by the engines' tokens (their KV events usable), 0 when by bytes; "
            "label tokenizer: the --tokenizer asked for.",
            ["deployment", "tokenizer"], registry=r,
        )  # fmt: skip
        self._hits = self._flushed_hits = 0
        self._blocks = self._flushed_blocks = 0
        # Bound children by label values: labels() costs microseconds on every request otherwise.
        self._hops: dict[str, Histogram] = {}
        self._decisions: dict[tuple[str, str], Counter] = {}
        self._requests: dict[tuple[str, str], Counter] = {}
        self._handoffs: dict[str, Counter] = {}
        self._cached = self.prefix_blocks.labels(deployment, "true")
        self._uncached = self.prefix_blocks.labels(deployment, "false")
        self._ratio = self.prefix_hit_ratio.labels(deployment)
        self.inflight_now = self.inflight.labels(deployment)

    def hop(self, hop: str, seconds: float) -> None:
        counts = self._hop_counts.get(hop)
        if counts is None:
            counts = self._hop_counts[hop] = [0.0] * (len(_HOP_BUCKETS) + 2)
        counts[bisect_left(_HOP_BUCKETS, seconds)] += 1  # the first bucket whose bound is >= seconds
        counts[-1] += seconds

    def _count(self, key: tuple[str, ...], n: int = 1) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + n

    def decision(self, role: str, reason: str) -> None:
        self._count(("decision", role, reason))

    def request(self, endpoint: str, code: int) -> None:
        self._count(("request", endpoint, str(code)))

    def handoff(self, path: str) -> None:
        self._count(("handoff", path))

    def prompt(self, blocks: int, hit: int) -> None:
        if blocks <= 0:
            return
        self._hits += hit
        self._blocks += blocks

    def flush(self) -> None:
        """Apply the batched counts to the series (a scrape calls this through the registry)."""
        counts, self._counts = self._counts, {}
        for (kind, *labels), n in counts.items():
            if kind == "decision":
                self._decision_child(labels[0], labels[1]).inc(n)
            elif kind == "request":
                self._request_child(labels[0], labels[1]).inc(n)
            else:
                self._handoff_child(labels[0]).inc(n)
        hops, self._hop_counts = self._hop_counts, {}
        for hop, per_bucket in hops.items():
            child = self._hops.get(hop)
            if child is None:
                child = self._hops[hop] = self.hop_latency.labels(self.deployment, hop)
            for i, seen in enumerate(per_bucket[:-1]):
                if seen:
                    child._buckets[i].inc(seen)  # what Histogram.observe does, `seen` observations at once
            child._sum.inc(per_bucket[-1])
        cached, self._flushed_hits = self._hits - self._flushed_hits, self._hits
        total, self._flushed_blocks = self._blocks - self._flushed_blocks, self._blocks
        if total:
            self._cached.inc(cached)
            self._uncached.inc(total - cached)
            self._ratio.set(self._hits / self._blocks)

    def _decision_child(self, role: str, reason: str) -> Counter:
        child = self._decisions.get((role, reason))
        if child is None:
            child = self._decisions[role, reason] = self.decisions.labels(self.deployment, role, reason)
        return child

    def _request_child(self, endpoint: str, code: str) -> Counter:
        child = self._requests.get((endpoint, code))
        if child is None:
            child = self._requests[endpoint, code] = self.requests.labels(self.deployment, endpoint, code)
        return child

    def _handoff_child(self, path: str) -> Counter:
        child = self._handoffs.get(path)
        if child is None:
            child = self._handoffs[path] = self.handoffs.labels(self.deployment, path)
        return child

    def kv_events(self, views: Callable[[], Mapping[str, EventCounts]]) -> None:
        """Export the KV event counts of the views `views()` returns, read at each scrape."""
        self.registry.register(_KvEvents(self.deployment, views))

    def peers(self, state: PeerState) -> None:
        """Export the replica exchange's state, read at each scrape."""
        self.registry.register(_Peers(self.deployment, state))

    def tokenizer(self, spec: str, loaded: bool) -> None:
        """Whether the --tokenizer asked for (`spec`) is in use: an hf: one that could not be fetched is 0."""
        self.tokenizer_loaded.labels(self.deployment, spec).set(1 if loaded else 0)

    def error(self, kind: str) -> None:
        self.errors.labels(self.deployment, kind).inc()
