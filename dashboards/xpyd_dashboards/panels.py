"""What the dashboards show: every panel as plain data (title, PromQL, unit), free of Grafana's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from xpyd_dashboards import metrics as m


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel and the legend Grafana draws for its series."""

    expr: str
    legend: str


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


def _quantiles(bucket: str) -> tuple[Query, ...]:
    """p50 and p99 per pool role of a vLLM latency histogram."""
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
                Query(f"sum by (xpyd_role) ({m.worker(m.VLLM_WAITING)})", "waiting {{xpyd_role}}"),
                Query(f"sum by (xpyd_role) ({m.worker(m.VLLM_RUNNING)})", "running {{xpyd_role}}"),
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

LATENCY = RowSpec(
    "Latency",
    (
        PanelSpec(
            "Time to first token (p50, p99)",
            "vLLM's TTFT per pool: on prefill it is the prefill time, on decode it includes the KV handoff.",
            "s",
            _quantiles(m.VLLM_TTFT_BUCKET),
        ),
        PanelSpec(
            "Inter-token latency (p50, p99)",
            "Time between streamed tokens, per pool (decode pools produce almost all of them).",
            "s",
            _quantiles(m.VLLM_ITL_BUCKET),
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
                Query(f"avg by (xpyd_role) ({m.worker(m.VLLM_KV_USAGE)})", "mean {{xpyd_role}}"),
                Query(f"max by (xpyd_role) ({m.worker(m.VLLM_KV_USAGE)})", "max {{xpyd_role}}"),
            ),
        ),
        PanelSpec(
            "Prefix cache hit ratio",
            "Router: share of prompt tokens its chosen worker already had cached. Workers: vLLM's own count.",
            "percentunit",
            (
                Query(f"avg({m.own(m.ROUTER_PREFIX_HIT_RATIO)})", "router"),
                Query(
                    f"sum by (xpyd_role) ({m.worker_rate(m.VLLM_PREFIX_HITS)})"
                    f" / sum by (xpyd_role) ({m.worker_rate(m.VLLM_PREFIX_QUERIES)})",
                    "workers {{xpyd_role}}",
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

DEPLOYMENT = DashboardSpec(
    name="xpyd-deployment",
    uid="xpyd-deployment",
    title="xpyd / DisaggregatedDeployment",
    description="One DisaggregatedDeployment: pools, queues, latency, KV cache, routing, autoscaling.",
    rows=(SCALING, LATENCY, CACHE),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (DEPLOYMENT,)
