"""The router's own Prometheus series (xpyd_router_*), all labelled by deployment."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from xpyd_api import metric_names as names

# Prompt blocks routed to a worker that holds them in its CPU tier after its GPU-held prefix (reloaded,
# not recomputed, as far as the index can tell); the GPU tier's are the `cached="true"` prompt blocks.
ROUTER_CPU_TIER_BLOCKS = "xpyd_router_cpu_tier_blocks_total"

_HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A KV handoff: ~1 ms (NVLink, a short prompt) to seconds (a first NIXL handshake, a long prompt over RDMA).
_HANDOFF_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
HOLD_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)  # a cold start: seconds to minutes
_PAIR = ["deployment", "prefill", "decode"]  # per prefill/decode pair: P x D series at most


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
    """What one worker's KV event view counted (xpyd_router.kv.engine_view.ViewStats)."""

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


class HoldState(Protocol):
    """What the waiting room knows (xpyd_router.hold.ColdHold)."""

    @property
    def held(self) -> int: ...

    @property
    def counts(self) -> Mapping[str, int]: ...


class _Hold:
    """The waiting room for requests no worker can take yet, read at scrape time."""

    def __init__(self, deployment: str, state: HoldState) -> None:
        self.deployment, self.state = deployment, state

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        d = [self.deployment]
        held = GaugeMetricFamily(
            names.ROUTER_HELD,
            "Requests waiting for a worker to become ready (a pool scaled to zero or starting): the autoscaler "
            "wakes the pools while it is above zero.",
            labels=["deployment"],
        )
        held.add_metric(d, self.state.held)
        outcomes = CounterMetricFamily(
            names.ROUTER_HOLD_OUTCOMES.removesuffix("_total"),
            "Requests that waited for a worker, by outcome: served, timeout (503 after --hold-seconds), full "
            "(503 at once: --hold-max were waiting).",
            labels=["deployment", "outcome"],
        )
        for outcome, n in self.state.counts.items():
            outcomes.add_metric([*d, outcome], n)
        return [held, outcomes]


class RouterMetrics:
    """The series; per-request counts go to plain ints (no lock each) that a scrape applies."""

    def __init__(self, deployment: str, registry: CollectorRegistry | None = None) -> None:
        self.deployment = deployment
        self.registry = registry or CollectorRegistry()
        r = self.registry
        r.register(_Flush(self.flush))
        self._counts: dict[tuple[str, ...], int] = {}  # (series, *labels) -> increments not applied yet
        self._hop_counts: dict[str, list[float]] = {}  # hop -> [count per bucket..., sum] not applied yet
        self._pair_counts: dict[tuple[str, str], list[float]] = {}  # (prefill, decode) -> the same, handoffs
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
        self.cpu_tier_blocks = Counter(
            ROUTER_CPU_TIER_BLOCKS,
            "Prompt blocks routed to a worker holding them in its CPU tier (KV offloading) after its "
            "GPU-held prefix: expected reloads over the host link instead of recomputes.",
            ["deployment"], registry=r,
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
        self.revision_workers = Gauge(
            names.ROUTER_REVISION_WORKERS,
            "Ready workers per engine revision (pod label xpyd.io/engine-rev) and role: KV moves only within "
            "one revision, so a revision pairs where both roles have one (two revisions while an engine change rolls).",
            ["deployment", "revision", "role"], registry=r,
        )  # fmt: skip
        self.pairable = Gauge(
            names.ROUTER_PAIRABLE,
            "Ready workers of the scarcer role (prefill or decode) summed over engine revisions: the prefill/decode "
            "capacity the router can pair; 0 with ready workers in both roles means no revision has both.",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.pair_warmups = Counter(
            names.ROUTER_PAIR_WARMUPS,
            "Warm-up handoffs (one tiny request per new prefill/decode pair, so no client pays a first NIXL "
            "handshake) by outcome: done, failed, timeout, skipped, cancelled (the router stopping). "
            "The engines count their KV transfers.",
            ["deployment", "outcome"], registry=r,
        )  # fmt: skip
        self.pair_warmups_running = Gauge(
            names.ROUTER_PAIR_WARMUPS_RUNNING, "Warm-up handoffs in flight.", ["deployment"], registry=r,
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
        self.handoff_latency = Histogram(
            names.ROUTER_HANDOFF_LATENCY,
            "KV handoff latency per prefill/decode pair: from the prefill hop's end to the decode hop's first "
            "byte; streamed requests over two hops (vLLM's NIXL) only: a non-streamed one has no first token "
            "the router sees, and SGLang's legs overlap.",
            _PAIR, buckets=_HANDOFF_BUCKETS, registry=r,
        )  # fmt: skip
        self.handoff_bytes = Counter(
            names.ROUTER_HANDOFF_BYTES,
            "KV bytes handed over per pair: the prefill reply's usage.prompt_tokens x --kv-bytes-per-token "
            "(no series without it); an upper bound, as a decode worker's own prefix hits are not pulled.",
            _PAIR, registry=r,
        )  # fmt: skip
        self.handoff_failures = Counter(
            names.ROUTER_HANDOFF_FAILURES,
            "Decode legs that failed after their prefill succeeded (SGLang: beside it), per pair, by stage: "
            "unreachable (refused, reset, timed out) or error (5xx or malformed before the first token).",
            [*_PAIR, "stage"], registry=r,
        )  # fmt: skip
        self.handoff_retries = Counter(
            names.ROUTER_HANDOFF_RETRIES, "Requests retried on other workers after their pair's handoff failed.",
            _PAIR, registry=r,
        )  # fmt: skip
        self.pairs_cooling = Gauge(
            names.ROUTER_PAIRS_COOLING, "Prefill/decode pairs out of pairing for a cool-off (not their workers).",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.handoff_breakeven = Gauge(
            names.ROUTER_HANDOFF_BREAKEVEN,
            "The handoff latency a prefill/decode pair is held to (--handoff-slow-seconds): the break-even, the "
            "decode stall that disaggregation saves, unless spec.router.handoffSlowSeconds says otherwise; 0: none "
            "(slow handoffs trip no pair). The XpydKvHandoffSlow alert compares each pair's p99 with it.",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.pair_trips = Counter(
            names.ROUTER_PAIR_TRIPS,
            "Pairs taken out of pairing, by reason: failures (handoffs failed in a row) or slow "
            "(handoffs over --handoff-slow-seconds in a row).",
            [*_PAIR, "reason"], registry=r,
        )  # fmt: skip
        self.kv_bytes_per_token = 0  # --kv-bytes-per-token; 0: no bytes series
        self._pair_children: dict[tuple[str, ...], Counter] = {}
        self._pair_hists: dict[tuple[str, str], Histogram] = {}
        self._pairs_seen: set[tuple[str, str]] = set()
        self._new_pairs: list[tuple[str, str]] = []  # pairs whose series a scrape is to create (at zero)
        self._hits = self._flushed_hits = 0
        self._blocks = self._flushed_blocks = 0
        self._offloaded = self._flushed_offloaded = 0
        # Bound children by label values: labels() costs microseconds on every request otherwise.
        self._hops: dict[str, Histogram] = {}
        self._decisions: dict[tuple[str, str], Counter] = {}
        self._requests: dict[tuple[str, str], Counter] = {}
        self._handoffs: dict[str, Counter] = {}
        self._cached = self.prefix_blocks.labels(deployment, "true")
        self._uncached = self.prefix_blocks.labels(deployment, "false")
        self._ratio = self.prefix_hit_ratio.labels(deployment)
        self._cpu_tier = self.cpu_tier_blocks.labels(deployment)
        self.inflight_now = self.inflight.labels(deployment)

    def hop(self, hop: str, seconds: float) -> None:
        counts = self._hop_counts.get(hop)
        if counts is None:
            counts = self._hop_counts[hop] = [0.0] * (len(_HOP_BUCKETS) + 2)
        counts[bisect_left(_HOP_BUCKETS, seconds)] += 1  # the first bucket whose bound is >= seconds
        counts[-1] += seconds

    def pair(self, prefill: str, decode: str) -> None:
        """A handoff between the two begins: the pair's series exist from then on (at zero until counted),
        so a dashboard's failure panel shows 0 rather than nothing."""
        if (prefill, decode) not in self._pairs_seen:
            self._pairs_seen.add((prefill, decode))
            self._new_pairs.append((prefill, decode))

    def _create_pair(self, prefill: str, decode: str) -> None:
        d = self.deployment
        self._pair_hists.setdefault((prefill, decode), self.handoff_latency.labels(d, prefill, decode))
        for key in (("failure", prefill, decode, "unreachable"), ("failure", prefill, decode, "error"),
                    ("retry", prefill, decode)):  # fmt: skip
            self._pair_child(key)
        if self.kv_bytes_per_token > 0:
            self._pair_child(("bytes", prefill, decode))
        for reason in ("failures", "slow"):
            self.pair_trips.labels(d, prefill, decode, reason)

    def handoff_seconds(self, prefill: str, decode: str, seconds: float) -> None:
        """One pair's handoff latency, batched like `hop`."""
        counts = self._pair_counts.get((prefill, decode))
        if counts is None:
            counts = self._pair_counts[prefill, decode] = [0.0] * (len(_HANDOFF_BUCKETS) + 2)
        counts[bisect_left(_HANDOFF_BUCKETS, seconds)] += 1
        counts[-1] += seconds

    def handoff_tokens(self, prefill: str, decode: str, tokens: int) -> None:
        """A pair handed over `tokens` prompt tokens' KV (counted in bytes when the bytes per token are known)."""
        if self.kv_bytes_per_token > 0 and tokens > 0:
            self._count(("bytes", prefill, decode), tokens * self.kv_bytes_per_token)

    def handoff_failed(self, prefill: str, decode: str, stage: str) -> None:
        self._count(("failure", prefill, decode, stage))

    def handoff_retried(self, prefill: str, decode: str) -> None:
        self._count(("retry", prefill, decode))

    def pair_tripped(self, prefill: str, decode: str, reason: str) -> None:
        """Rare (a trip): applied at once."""
        self.pair_trips.labels(self.deployment, prefill, decode, reason).inc()

    def _pair_child(self, key: tuple[str, ...]) -> Counter:
        child = self._pair_children.get(key)
        if child is None:
            kind, *labels = key
            family = {"bytes": self.handoff_bytes, "failure": self.handoff_failures, "retry": self.handoff_retries}
            child = self._pair_children[key] = family[kind].labels(self.deployment, *labels)
        return child

    def _count(self, key: tuple[str, ...], n: int = 1) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + n

    def decision(self, role: str, reason: str) -> None:
        self._count(("decision", role, reason))

    def request(self, endpoint: str, code: int) -> None:
        self._count(("request", endpoint, str(code)))

    def handoff(self, path: str) -> None:
        self._count(("handoff", path))

    def prompt(self, blocks: int, hit: int, offloaded: int = 0) -> None:
        """A routed prompt of `blocks` blocks: `hit` on its worker's GPU, `offloaded` more on its CPU tier."""
        if blocks <= 0:
            return
        self._hits += hit
        self._blocks += blocks
        self._offloaded += offloaded

    def flush(self) -> None:
        """Apply the batched counts to the series (a scrape calls this through the registry)."""
        new, self._new_pairs = self._new_pairs, []
        for prefill, decode in new:
            self._create_pair(prefill, decode)
        counts, self._counts = self._counts, {}
        for (kind, *labels), n in counts.items():
            if kind == "decision":
                self._decision_child(labels[0], labels[1]).inc(n)
            elif kind == "request":
                self._request_child(labels[0], labels[1]).inc(n)
            elif kind == "handoff":
                self._handoff_child(labels[0]).inc(n)
            else:
                self._pair_child((kind, *labels)).inc(n)
        hops, self._hop_counts = self._hop_counts, {}
        for hop, per_bucket in hops.items():
            child = self._hops.get(hop)
            if child is None:
                child = self._hops[hop] = self.hop_latency.labels(self.deployment, hop)
            for i, seen in enumerate(per_bucket[:-1]):
                if seen:
                    child._buckets[i].inc(seen)  # what Histogram.observe does, `seen` observations at once
            child._sum.inc(per_bucket[-1])
        pairs, self._pair_counts = self._pair_counts, {}
        for pair, per_bucket in pairs.items():
            hist = self._pair_hists.get(pair)
            if hist is None:
                hist = self._pair_hists[pair] = self.handoff_latency.labels(self.deployment, *pair)
            for i, seen in enumerate(per_bucket[:-1]):
                if seen:
                    hist._buckets[i].inc(seen)
            hist._sum.inc(per_bucket[-1])
        cached, self._flushed_hits = self._hits - self._flushed_hits, self._hits
        total, self._flushed_blocks = self._blocks - self._flushed_blocks, self._blocks
        if total:
            self._cached.inc(cached)
            self._uncached.inc(total - cached)
            self._ratio.set(self._hits / self._blocks)
        offloaded, self._flushed_offloaded = self._offloaded - self._flushed_offloaded, self._offloaded
        if offloaded:
            self._cpu_tier.inc(offloaded)

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

    def hold(self, state: HoldState) -> Callable[[float], None]:
        """Export the waiting room's state, read at each scrape; returns what to call with each served
        request's wait."""
        self.registry.register(_Hold(self.deployment, state))
        wait = Histogram(
            names.ROUTER_HOLD_WAIT, "How long a request waited for a worker to become ready before it was served.",
            ["deployment"], buckets=HOLD_BUCKETS, registry=self.registry,
        ).labels(self.deployment)  # fmt: skip
        return wait.observe

    def peers(self, state: PeerState) -> None:
        """Export the replica exchange's state, read at each scrape."""
        self.registry.register(_Peers(self.deployment, state))

    def tokenizer(self, spec: str, loaded: bool) -> None:
        """Whether the --tokenizer asked for (`spec`) is in use: an hf: one that could not be fetched is 0."""
        self.tokenizer_loaded.labels(self.deployment, spec).set(1 if loaded else 0)

    def error(self, kind: str) -> None:
        self.errors.labels(self.deployment, kind).inc()
