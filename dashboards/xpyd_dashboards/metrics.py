"""Metric names and label selectors the dashboards query: one place to keep them in step with the code."""

from __future__ import annotations

from typing import Final

# vLLM worker metrics (DESIGN.md section 6); the emulator exports the same names.
VLLM_WAITING: Final = "vllm:num_requests_waiting"
VLLM_RUNNING: Final = "vllm:num_requests_running"
VLLM_KV_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_TTFT_BUCKET: Final = "vllm:time_to_first_token_seconds_bucket"
VLLM_ITL_BUCKET: Final = "vllm:inter_token_latency_seconds_bucket"
VLLM_PREFIX_QUERIES: Final = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_HITS: Final = "vllm:prefix_cache_hits_total"

# Our own metrics, labelled `deployment` (the DisaggregatedDeployment's name); routers get `namespace`
# from their scrape target, the operator's autoscaler series carry it themselves (honorLabels).
AUTOSCALER_DESIRED: Final = "xpyd_autoscaler_desired_replicas"
AUTOSCALER_ACTUAL: Final = "xpyd_autoscaler_actual_replicas"
AUTOSCALER_REASON: Final = "xpyd_autoscaler_decision_reason"  # 1 for the last decision's reason
AUTOSCALER_SCALE_EVENTS: Final = "xpyd_autoscaler_scale_events_total"
ROUTER_REQUESTS: Final = "xpyd_router_requests_total"
ROUTER_PREFIX_HIT_RATIO: Final = "xpyd_router_prefix_hit_ratio"
ROUTER_KV_HANDOFFS: Final = "xpyd_router_kv_handoffs_total"
ROUTER_INFLIGHT: Final = "xpyd_router_inflight_requests"  # every router has it: the variables list it

# Grafana template variables every per-deployment query is filtered by.
VAR_NAMESPACE: Final = "namespace"
VAR_DEPLOYMENT: Final = "deployment"
VAR_DATASOURCE: Final = "datasource"
RATE_INTERVAL: Final = "$__rate_interval"

# Scrape contract shared with the autoscaler (xpyd_operator.autoscaling_promql): worker and router
# pods are scraped with `namespace` and `pod` target labels, and their pod labels xpyd.io/deployment
# and xpyd.io/role relabelled to `xpyd_deployment` and `xpyd_role` (the chart's PodMonitor does it).
POD_DEPLOYMENT: Final = "xpyd_deployment"
POD_ROLE: Final = "xpyd_role"
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
