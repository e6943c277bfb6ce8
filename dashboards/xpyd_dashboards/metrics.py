"""The label selectors the dashboards query with, over the metric names of `xpyd_api.metric_names`."""

from __future__ import annotations

from typing import Final

from xpyd_api import engines
from xpyd_api import metric_names as names

# Worker metrics in every engine's names (xpyd_api.engines.METRICS): a deployment runs one engine, so a
# query reads each name and `or` keeps whichever its pods export (vLLM's; the emulator exports the same).
_ENGINES: Final = tuple(dict.fromkeys(engines.METRICS.values()))  # each kind's map once
WAITING: Final = tuple(e.waiting for e in _ENGINES)
RUNNING: Final = tuple(e.running for e in _ENGINES)
KV_USAGE: Final = tuple(e.kv_usage[0] for e in _ENGINES)
TTFT_BUCKET: Final = tuple(f"{e.ttft}_bucket" for e in _ENGINES)
ITL_BUCKET: Final = tuple(f"{e.itl}_bucket" for e in _ENGINES)
PREFIX_QUERIES: Final = names.PREFIX_QUERIES  # vLLM counts tokens looked up and hit
PREFIX_HITS: Final = names.PREFIX_HITS
CACHE_HIT_RATE: Final = tuple(e.cache_hit_rate for e in _ENGINES if e.cache_hit_rate)  # SGLang's own ratio
# The engines' own KV-transfer series (vLLM's NixlConnector; SGLang exports none of these)
KV_XFER_TIME_BUCKET: Final = tuple(f"{e.kv_transfers}_bucket" for e in _ENGINES if e.kv_transfers)
KV_XFER_BYTES_SUM: Final = tuple(f"{e.kv_transfer_bytes}_sum" for e in _ENGINES if e.kv_transfer_bytes)
KV_XFER_FAILURES: Final = tuple(e.kv_transfer_failures for e in _ENGINES if e.kv_transfer_failures)

# Our own metrics, labelled `deployment` (the DisaggregatedDeployment's name); routers get `namespace`
# from their scrape target, the operator's autoscaler series carry it themselves (honorLabels).
AUTOSCALER_DESIRED: Final = names.AUTOSCALER_DESIRED
AUTOSCALER_ACTUAL: Final = names.AUTOSCALER_ACTUAL
AUTOSCALER_REASON: Final = names.AUTOSCALER_REASON  # 1 for the last decision's reason
AUTOSCALER_SCALE_EVENTS: Final = names.AUTOSCALER_SCALE_EVENTS
AUTOSCALER_WAKES: Final = names.AUTOSCALER_WAKES
# the SLO policy's (spec.slo set): the stated SLO and what the policy has learnt per pool
AUTOSCALER_SLO_TARGET: Final = names.AUTOSCALER_SLO_TARGET  # label latency: ttft, itl
AUTOSCALER_SLO_PERCENTILE: Final = names.AUTOSCALER_SLO_PERCENTILE
AUTOSCALER_SLO_GOAL: Final = names.AUTOSCALER_SLO_GOAL
AUTOSCALER_SLO_CORRECTION: Final = names.AUTOSCALER_SLO_CORRECTION
AUTOSCALER_SLO_PREDICTED: Final = names.AUTOSCALER_SLO_PREDICTED
AUTOSCALER_READY_SECONDS: Final = names.AUTOSCALER_READY_SECONDS
ROUTER_REQUESTS: Final = names.ROUTER_REQUESTS
ROUTER_PREFIX_HIT_RATIO: Final = names.ROUTER_PREFIX_HIT_RATIO
ROUTER_KV_HANDOFFS: Final = names.ROUTER_KV_HANDOFFS
ROUTER_PROMPT_BLOCKS: Final = names.ROUTER_PROMPT_BLOCKS
ROUTER_CPU_TIER_BLOCKS: Final = "xpyd_router_cpu_tier_blocks_total"  # xpyd_router.metrics: CPU-tier hits
ROUTER_KV_EVENT_BLOCKS: Final = names.ROUTER_KV_EVENT_BLOCKS
ROUTER_HANDOFF_LATENCY_BUCKET: Final = f"{names.ROUTER_HANDOFF_LATENCY}_bucket"
ROUTER_HANDOFF_BYTES: Final = names.ROUTER_HANDOFF_BYTES
ROUTER_HANDOFF_FAILURES: Final = names.ROUTER_HANDOFF_FAILURES
ROUTER_HANDOFF_RETRIES: Final = names.ROUTER_HANDOFF_RETRIES
ROUTER_PAIRS_COOLING: Final = names.ROUTER_PAIRS_COOLING
ROUTER_REVISION_WORKERS: Final = names.ROUTER_REVISION_WORKERS
ROUTER_PAIRABLE: Final = names.ROUTER_PAIRABLE
ROUTER_PAIR_TRIPS: Final = names.ROUTER_PAIR_TRIPS
ROUTER_HELD: Final = names.ROUTER_HELD  # routers of a deployment that may scale to zero only
ROUTER_HOLD_OUTCOMES: Final = names.ROUTER_HOLD_OUTCOMES
ROUTER_INFLIGHT: Final = names.ROUTER_INFLIGHT  # every router has it: the variables list it

# Grafana template variables every per-deployment query is filtered by.
VAR_NAMESPACE: Final = "namespace"
VAR_DEPLOYMENT: Final = "deployment"
VAR_DATASOURCE: Final = "datasource"
RATE_INTERVAL: Final = "$__rate_interval"

# Scrape contract shared with the autoscaler (xpyd_operator.autoscaling.promql): worker and router
# pods are scraped with `namespace` and `pod` target labels, and their pod labels xpyd.io/deployment
# and xpyd.io/role relabelled to `xpyd_deployment` and `xpyd_role` (the chart's PodMonitor does it).
POD_DEPLOYMENT: Final = names.POD_DEPLOYMENT
POD_ROLE: Final = names.POD_ROLE
WORKER_ROLES: Final = "prefill|decode|worker"


def worker(metric: str | tuple[str, ...]) -> str:
    """A worker metric of the selected deployment's engine pods; several names (one per engine) are or-ed."""
    sel = f'{{namespace="$namespace", {POD_DEPLOYMENT}="$deployment", {POD_ROLE}=~"{WORKER_ROLES}"}}'
    if isinstance(metric, str):
        return metric + sel
    return metric[0] + sel if len(metric) == 1 else "(" + " or ".join(n + sel for n in metric) + ")"


def own(metric: str, **matchers: str) -> str:
    """One of xpyd's own metrics for the selected deployment (labelled `deployment` by its exporter), and
    any further label equal to a value (`own(m, latency="ttft")`)."""
    more = "".join(f', {label}="{value}"' for label, value in matchers.items())
    return f'{metric}{{namespace="$namespace", deployment="$deployment"{more}}}'


def worker_rate(metric: str | tuple[str, ...]) -> str:
    """The per-second rate of a worker counter or histogram bucket (one rate per engine's name, or-ed)."""
    names_ = (metric,) if isinstance(metric, str) else metric
    rates = [f"rate({worker(n)}[{RATE_INTERVAL}])" for n in names_]
    return rates[0] if len(rates) == 1 else "(" + " or ".join(rates) + ")"
