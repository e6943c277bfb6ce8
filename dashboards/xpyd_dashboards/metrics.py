"""The label selectors the dashboards query with, over the metric names of `xpyd_api.metric_names`."""

from __future__ import annotations

from typing import Final

from xpyd_api import metric_names as names

# vLLM worker metrics (DESIGN.md section 6); the emulator exports the same names.
VLLM_WAITING: Final = names.WAITING
VLLM_RUNNING: Final = names.RUNNING
VLLM_KV_USAGE: Final = names.KV_USAGE
VLLM_TTFT_BUCKET: Final = f"{names.TTFT}_bucket"
VLLM_ITL_BUCKET: Final = f"{names.ITL}_bucket"
VLLM_PREFIX_QUERIES: Final = names.PREFIX_QUERIES
VLLM_PREFIX_HITS: Final = names.PREFIX_HITS

# Our own metrics, labelled `deployment` (the DisaggregatedDeployment's name); routers get `namespace`
# from their scrape target, the operator's autoscaler series carry it themselves (honorLabels).
AUTOSCALER_DESIRED: Final = names.AUTOSCALER_DESIRED
AUTOSCALER_ACTUAL: Final = names.AUTOSCALER_ACTUAL
AUTOSCALER_REASON: Final = names.AUTOSCALER_REASON  # 1 for the last decision's reason
AUTOSCALER_SCALE_EVENTS: Final = names.AUTOSCALER_SCALE_EVENTS
ROUTER_REQUESTS: Final = names.ROUTER_REQUESTS
ROUTER_PREFIX_HIT_RATIO: Final = names.ROUTER_PREFIX_HIT_RATIO
ROUTER_KV_HANDOFFS: Final = names.ROUTER_KV_HANDOFFS
ROUTER_KV_EVENT_BLOCKS: Final = names.ROUTER_KV_EVENT_BLOCKS
ROUTER_INFLIGHT: Final = names.ROUTER_INFLIGHT  # every router has it: the variables list it

# Grafana template variables every per-deployment query is filtered by.
VAR_NAMESPACE: Final = "namespace"
VAR_DEPLOYMENT: Final = "deployment"
VAR_DATASOURCE: Final = "datasource"
RATE_INTERVAL: Final = "$__rate_interval"

# Scrape contract shared with the autoscaler (xpyd_operator.autoscaling_promql): worker and router
# pods are scraped with `namespace` and `pod` target labels, and their pod labels xpyd.io/deployment
# and xpyd.io/role relabelled to `xpyd_deployment` and `xpyd_role` (the chart's PodMonitor does it).
POD_DEPLOYMENT: Final = names.POD_DEPLOYMENT
POD_ROLE: Final = names.POD_ROLE
WORKER_ROLES: Final = "prefill|decode|worker"


def worker(metric: str) -> str:
    """A worker metric of the selected deployment's engine pods."""
    return f'{metric}{{namespace="$namespace", {POD_DEPLOYMENT}="$deployment", {POD_ROLE}=~"{WORKER_ROLES}"}}'


def own(metric: str) -> str:
    """One of xpyd's own metrics for the selected deployment (labelled `deployment` by its exporter)."""
    return f'{metric}{{namespace="$namespace", deployment="$deployment"}}'


def worker_rate(metric: str) -> str:
    """The per-second rate of a worker counter or histogram bucket."""
    return f"rate({worker(metric)}[{RATE_INTERVAL}])"
