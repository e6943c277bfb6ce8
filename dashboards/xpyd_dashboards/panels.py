"""What the dashboards show: every panel as plain data (title, PromQL, unit), free of Grafana's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from xpyd_dashboards import metrics as m

# What a deployment must run for some series to exist at all: a query that needs one may be empty
# without it (e2e/dashboards_check.py asks data of such a query only where told the deployment has it).
SLO: Final = "slo"  # spec.slo stated: the SLO policy's series
ZERO: Final = "scale-to-zero"  # a pool with minReplicas 0: the router holds requests, the autoscaler wakes pools
FEATURES: Final = (SLO, ZERO)


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel, the legend Grafana draws for its series, and what it needs (FEATURES)."""

    expr: str
    legend: str
    needs: str = ""

    def __post_init__(self) -> None:
        if self.needs and self.needs not in FEATURES:
            raise ValueError(f"unknown feature {self.needs!r}; known: {FEATURES}")


@dataclass(frozen=True)
class PanelSpec:
    """A time-series panel: a title, what it means, its unit and its queries."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 12


@dataclass(frozen=True)
class RowSpec:
    """A collapsible row grouping related panels."""

    title: str
    panels: tuple[PanelSpec, ...]


@dataclass(frozen=True)
class DashboardSpec:
    """A whole dashboard: file name, uid, title and rows."""

    name: str
    uid: str
    title: str
    description: str
    rows: tuple[RowSpec, ...] = field(default_factory=tuple)

    def panels(self) -> list[PanelSpec]:
        """Every panel in display order."""
        return [panel for row in self.rows for panel in row.panels]


def _quantiles(bucket: tuple[str, ...]) -> tuple[Query, ...]:
    """p50 and p99 per pool role of an engine latency histogram (its name in each engine)."""
    by_role = f"sum by (le, xpyd_role) ({m.worker_rate(bucket)})"
    return tuple(
        Query(f"histogram_quantile({q}, {by_role})", f"p{round(q * 100)} {{{{xpyd_role}}}}") for q in (0.5, 0.99)
    )


SCALING = RowSpec(
    "Scaling",
    (
        PanelSpec(
            "xPyD over time: desired vs actual replicas",
            "Replicas per pool: what the autoscaler wants (desired) and what is running (actual).",
            "short",
            (
                Query(f"sum by (role) ({m.own(m.AUTOSCALER_DESIRED)})", "desired {{role}}"),
                Query(f"sum by (role) ({m.own(m.AUTOSCALER_ACTUAL)})", "actual {{role}}"),
            ),
        ),
        PanelSpec(
            "Queue length per pool",
            "Requests waiting (and running) summed over each pool; the autoscaler's input.",
            "short",
            (
                Query(f"sum by (xpyd_role) ({m.worker(m.WAITING)})", "waiting {{xpyd_role}}"),
                Query(f"sum by (xpyd_role) ({m.worker(m.RUNNING)})", "running {{xpyd_role}}"),
            ),
        ),
        PanelSpec(
            "Autoscaler decisions and reasons",
            "The reason of each pool's last decision (one line per reason while it holds), and the "
            "pool size changes the autoscaler made in the last 5 minutes.",
            "short",
            (
                Query(
                    f"max by (role, reason) ({m.own(m.AUTOSCALER_REASON)}) == 1",
                    "{{role}}: {{reason}}",
                ),
                Query(
                    f"sum by (role, direction) (increase({m.own(m.AUTOSCALER_SCALE_EVENTS)}[5m]))",
                    "{{role}} scaled {{direction}}",
                ),
            ),
            width=24,
        ),
    ),
)


def _at_slo_percentile(bucket: tuple[str, ...]) -> Query:
    """An engine latency histogram per pool role at spec.slo.percentile (read from the autoscaler's gauge)."""
    q = f"scalar(max({m.own(m.AUTOSCALER_SLO_PERCENTILE)})) / 100"
    by_role = f"sum by (le, xpyd_role) ({m.worker_rate(bucket)})"
    return Query(f"histogram_quantile({q}, {by_role})", "measured {{xpyd_role}}", SLO)


SLO_ROW = RowSpec(
    "SLO",
    (
        PanelSpec(
            "TTFT: SLO target vs measured",
            "spec.slo.ttftSeconds against the engines' TTFT at spec.slo.percentile, per pool: prefill's is its "
            "queue and prefill, decode's the KV handoff and first step, so a request's TTFT is about their sum. "
            "The SLO policy plans prefill's within the target less the KV handoff. Empty without spec.slo.",
            "s",
            (
                Query(f"max({m.own(m.AUTOSCALER_SLO_TARGET, latency='ttft')})", "target", SLO),
                _at_slo_percentile(m.TTFT_BUCKET),
            ),
        ),
        PanelSpec(
            "ITL: SLO target vs measured",
            "spec.slo.itlSeconds against the engines' inter-token latency at spec.slo.percentile, per pool "
            "(decode pools produce almost every token). The SLO policy plans decode's step within 90% of the target.",
            "s",
            (
                Query(f"max({m.own(m.AUTOSCALER_SLO_TARGET, latency='itl')})", "target", SLO),
                _at_slo_percentile(m.ITL_BUCKET),
            ),
        ),
        PanelSpec(
            "Predicted SLO attainment vs goal",
            "What the SLO policy predicts of the sizes it chose, per pool, against spec.slo.attainment: prefill, the "
            "share of requests whose TTFT fits its budget (queueing included); decode, 1 while the planned ITL "
            "fits the target, else target / planned ITL.",
            "percentunit",
            (
                Query(f"max by (role) ({m.own(m.AUTOSCALER_SLO_PREDICTED)})", "predicted {{role}}", SLO),
                Query(f"max({m.own(m.AUTOSCALER_SLO_GOAL)})", "goal", SLO),
            ),
        ),
        PanelSpec(
            "Performance model correction per pool",
            "Observed / predicted latency, smoothed and bounded to 0.5-4: 1 is xpyd's performance model as is. "
            "It moves only while a pool carries load (5% of a prefill replica's capacity, a sequence per decode "
            "replica) and settles as the policy learns the engines.",
            "short",
            (Query(f"max by (role) ({m.own(m.AUTOSCALER_SLO_CORRECTION)})", "{{role}}", SLO),),
        ),
        PanelSpec(
            "Replicas chosen per pool",
            "What the autoscaler asks of each pool (desired) and what is Ready.",
            "short",
            (
                Query(f"sum by (role) ({m.own(m.AUTOSCALER_DESIRED)})", "chosen {{role}}"),
                Query(f"sum by (role) ({m.own(m.AUTOSCALER_ACTUAL)})", "ready {{role}}"),
            ),
            width=8,
        ),
        PanelSpec(
            "Time to serve a new replica",
            "Measured seconds from a decision that grew a pool to all its replicas Ready (smoothed), per pool: "
            "the SLO policy sizes for the demand its trend reaches that far ahead. Empty until a scale-up "
            "completes (60 s assumed until then).",
            "s",
            (Query(f"max by (role) ({m.own(m.AUTOSCALER_READY_SECONDS)})", "{{role}}", SLO),),
            width=8,
        ),
        PanelSpec(
            "Requests held at zero, pools woken",
            "Requests the routers hold while no worker is ready (a pool at zero or starting), held requests by "
            "outcome in the last 5 minutes (served, timeout, full: the last two got a 503 with Retry-After), and "
            "the pools the autoscaler woke for them. Only for deployments with a pool at minReplicas 0.",
            "short",
            (
                Query(f"sum({m.own(m.ROUTER_HELD)})", "held", ZERO),
                Query(
                    f"sum by (outcome) (increase({m.own(m.ROUTER_HOLD_OUTCOMES)}[5m]))",
                    "{{outcome}}",
                    ZERO,
                ),
                Query(f"sum by (role) (increase({m.own(m.AUTOSCALER_WAKES)}[5m]))", "woken {{role}}", ZERO),
            ),
            width=8,
        ),
    ),
)

LATENCY = RowSpec(
    "Latency",
    (
        PanelSpec(
            "Time to first token (p50, p99)",
            "The engine's TTFT per pool: on prefill it is the prefill time, on decode it includes the KV handoff.",
            "s",
            _quantiles(m.TTFT_BUCKET),
        ),
        PanelSpec(
            "Inter-token latency (p50, p99)",
            "Time between streamed tokens, per pool (decode pools produce almost all of them).",
            "s",
            _quantiles(m.ITL_BUCKET),
        ),
    ),
)

CACHE = RowSpec(
    "KV cache and routing",
    (
        PanelSpec(
            "KV cache usage",
            "Fraction of the KV cache blocks in use, mean and max over the workers of each pool.",
            "percentunit",
            (
                Query(f"avg by (xpyd_role) ({m.worker(m.KV_USAGE)})", "mean {{xpyd_role}}"),
                Query(f"max by (xpyd_role) ({m.worker(m.KV_USAGE)})", "max {{xpyd_role}}"),
            ),
        ),
        PanelSpec(
            "Prefix cache hit ratio",
            "Router: share of prompt tokens its chosen worker already had cached. Workers: the engine's own "
            "count (vLLM's hit and query counters, or SGLang's hit-rate gauge for its pools).",
            "percentunit",
            (
                Query(f"avg({m.own(m.ROUTER_PREFIX_HIT_RATIO)})", "router"),
                Query(
                    f"(sum by (xpyd_role) ({m.worker_rate(m.PREFIX_HITS)})"
                    f" / sum by (xpyd_role) ({m.worker_rate(m.PREFIX_QUERIES)}))"
                    f" or avg by (xpyd_role) ({m.worker(m.CACHE_HIT_RATE)})",
                    "workers {{xpyd_role}}",
                ),
            ),
        ),
        PanelSpec(
            "Prefix hits by tier",
            "Router: share of routed prompt blocks its chosen worker held on the GPU, and in its CPU tier after "
            "that (KV offloading: reloaded over the host link, not recomputed). The CPU line stays at zero "
            "without offloading, or where the router's tier scorer found reloads do not pay.",
            "percentunit",
            (
                Query(
                    f'sum(rate({m.ROUTER_PROMPT_BLOCKS}{{namespace="$namespace", deployment="$deployment", '
                    f'cached="true"}}[{m.RATE_INTERVAL}]))'
                    f" / sum(rate({m.own(m.ROUTER_PROMPT_BLOCKS)}[{m.RATE_INTERVAL}])) or vector(0)",
                    "gpu",
                ),
                Query(
                    f"sum(rate({m.own(m.ROUTER_CPU_TIER_BLOCKS)}[{m.RATE_INTERVAL}]))"
                    f" / sum(rate({m.own(m.ROUTER_PROMPT_BLOCKS)}[{m.RATE_INTERVAL}])) or vector(0)",
                    "cpu",
                ),
            ),
        ),
        PanelSpec(
            "KV handoffs by path",
            "Prefill-to-decode KV transfers per second by path: NVLink inside a domain, else RDMA.",
            "reqps",
            (
                Query(
                    f"sum by (path) (rate({m.own(m.ROUTER_KV_HANDOFFS)}[{m.RATE_INTERVAL}]))",
                    "{{path}}",
                ),
            ),
        ),
        PanelSpec(
            "Engine KV events",
            "Blocks the engines reported stored and removed per second, as the routers applied them, by outcome "
            "(orphaned: parent never seen; mismatched: another block size). Flat at zero with traffic: the routers "
            "hear no engine (no tokenizer, or the event ports unreachable).",
            "ops",
            (
                Query(
                    f"sum by (outcome) (rate({m.own(m.ROUTER_KV_EVENT_BLOCKS)}[{m.RATE_INTERVAL}]))",
                    "{{outcome}}",
                ),
            ),
        ),
        PanelSpec(
            "Router requests",
            "Client requests per second through the router, by HTTP status code.",
            "reqps",
            (
                Query(
                    f"sum by (code) (rate({m.own(m.ROUTER_REQUESTS)}[{m.RATE_INTERVAL}]))",
                    "{{code}}",
                ),
            ),
        ),
    ),
)

TOP_PAIRS = 5  # the per-pair panels show the worst pairs only: P x D series otherwise


def _pair_quantiles() -> tuple[Query, ...]:
    """p50 and p99 of the router's handoff latency per prefill/decode pair, the TOP_PAIRS slowest."""
    by_pair = f"sum by (le, prefill, decode) (rate({m.own(m.ROUTER_HANDOFF_LATENCY_BUCKET)}[{m.RATE_INTERVAL}]))"
    return tuple(
        Query(
            f"topk({TOP_PAIRS}, histogram_quantile({q}, {by_pair}))",
            f"p{round(q * 100)} {{{{prefill}}}} → {{{{decode}}}}",
        )
        for q in (0.5, 0.99)
    )


KV_DATA_PATH = RowSpec(
    "KV data path",
    (
        PanelSpec(
            "KV handoff latency per pair (p50, p99)",
            f"The router's time from a prefill hop's end to the decode hop's first byte, per prefill/decode pair "
            f"(the {TOP_PAIRS} slowest): streamed requests over two hops only (vLLM's NIXL; not SGLang, whose legs "
            "overlap). It includes the decode engine's queue and the KV read.",
            "s",
            _pair_quantiles(),
        ),
        PanelSpec(
            "KV bytes handed over per pair",
            "Prompt tokens x the model's KV bytes per token, per second and pair (the busiest): an upper bound, "
            "as a decode worker's own prefix hits are not pulled. Engines: the bytes vLLM's NIXL moved, per pool.",
            "Bps",
            (
                Query(
                    f"topk({TOP_PAIRS}, sum by (prefill, decode) "
                    f"(rate({m.own(m.ROUTER_HANDOFF_BYTES)}[{m.RATE_INTERVAL}])))",
                    "{{prefill}} → {{decode}}",
                ),
                Query(f"sum by (xpyd_role) ({m.worker_rate(m.KV_XFER_BYTES_SUM)})", "engines {{xpyd_role}}"),
            ),
        ),
        PanelSpec(
            "KV handoff failures",
            "Decode legs failed after their prefill, per second, by stage (unreachable: refused, reset, timed "
            "out; error: 5xx or malformed before the first token), requests retried after one, and the failed "
            "transfers the engines' NIXL connectors count.",
            "ops",
            (
                Query(
                    f"sum by (stage) (rate({m.own(m.ROUTER_HANDOFF_FAILURES)}[{m.RATE_INTERVAL}]))",
                    "{{stage}}",
                ),
                Query(f"sum(rate({m.own(m.ROUTER_HANDOFF_RETRIES)}[{m.RATE_INTERVAL}]))", "retried"),
                Query(f"sum by (xpyd_role) ({m.worker_rate(m.KV_XFER_FAILURES)})", "engines {{xpyd_role}}"),
            ),
        ),
        PanelSpec(
            "Pairs cooling off",
            "Prefill/decode pairs each router holds out of pairing (its workers stay in rotation) and the "
            "pairs taken out in the last 5 minutes, by reason: handoffs failed in a row, or slow in a row.",
            "short",
            (
                Query(f"max({m.own(m.ROUTER_PAIRS_COOLING)})", "cooling off"),
                Query(f"sum by (reason) (increase({m.own(m.ROUTER_PAIR_TRIPS)}[5m]))", "tripped: {{reason}}"),
            ),
        ),
        PanelSpec(
            "Ready workers per engine revision",
            "What each router sees ready per engine revision and role: KV moves only within a revision, so "
            "during an engine change each revision pairs on its own; pairable is the scarcer role's ready "
            "workers summed over revisions (0 with workers in both roles: no revision has a pair).",
            "short",
            (
                Query(f"max by (revision, role) ({m.own(m.ROUTER_REVISION_WORKERS)})", "{{revision}} {{role}}"),
                Query(f"min({m.own(m.ROUTER_PAIRABLE)})", "pairable"),
            ),
        ),
        PanelSpec(
            "Engine KV transfer time (p50, p99)",
            "vLLM's own NIXL transfer time per KV read, on the decode side (vllm:nixl_xfer_time_seconds, from "
            "0.11.1): what the router's handoff latency spends moving bytes, without queueing.",
            "s",
            _quantiles(m.KV_XFER_TIME_BUCKET),
        ),
    ),
)

DEPLOYMENT = DashboardSpec(
    name="xpyd-deployment",
    uid="xpyd-deployment",
    title="xpyd / DisaggregatedDeployment",
    description="One DisaggregatedDeployment: pools, queues, the SLO, latency, KV cache, routing, autoscaling.",
    rows=(SCALING, SLO_ROW, LATENCY, CACHE, KV_DATA_PATH),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (DEPLOYMENT,)
