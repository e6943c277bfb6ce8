"""The PromQL the autoscaler runs, and the Prometheus labels (from the scrape config) it relies on.

Workers are scraped by Prometheus through ``kubernetes_sd_configs`` (role: pod). The relabeling
below turns the pod labels the operator sets (``xpyd.io/deployment``, ``xpyd.io/role``) into the
Prometheus labels the queries select on:

    namespace        <- __meta_kubernetes_namespace
    pod              <- __meta_kubernetes_pod_name
    xpyd_deployment  <- __meta_kubernetes_pod_label_xpyd_io_deployment
    xpyd_role        <- __meta_kubernetes_pod_label_xpyd_io_role

``SCRAPE_CONFIG`` is that job as YAML, for the cluster harness and the Helm chart to reuse.
"""

from __future__ import annotations

from typing import Final

from xpyd_api import labels
from xpyd_api import metric_names as names
from xpyd_api.engines import VLLM_METRICS, MetricNames

NAMESPACE_LABEL: Final = names.NAMESPACE_LABEL
POD_LABEL: Final = names.POD_LABEL
DEPLOYMENT_LABEL: Final = names.POD_DEPLOYMENT
ROLE_LABEL: Final = names.POD_ROLE


def _meta(label: str) -> str:
    """Prometheus's meta label for a pod label: every non-alphanumeric character becomes '_'."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


SCRAPE_JOB: Final = "xpyd-workers"
# Latency quantiles and the prefix hit ratio are taken over this window (`rate(...[1m])`: four of the chart's 15-s
# scrapes), counters' rates between the newest two scrapes in it (`irate`), so that a burst shows at the next
# decision rather than over a minute. The simulator observes the same way (xpyd_sim.scaling).
RATE_WINDOW: Final = "1m"
RATE_WINDOW_S: Final = 60.0
# The prompt-length quantiles scraped (PoolMetrics.prompt_tokens_p50, _p90, _p99): the SLO policy's prompt mix.
PROMPT_QUANTILES: Final = (0.5, 0.9, 0.99)
# Engine pods carry prometheus.io/scrape, /port and /path annotations (xpyd_operator.pools);
# the cluster harness (xpyd_cluster.prometheus) uses the same relabeling.
SCRAPE_CONFIG: Final = f"""\
- job_name: {SCRAPE_JOB}
  kubernetes_sd_configs:
    - role: pod
  relabel_configs:
    - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
      regex: "true"
      action: keep
    - source_labels: [__meta_kubernetes_pod_phase]
      regex: Running
      action: keep
    # only xpyd engine pods (prefill, decode, or the colocated worker pool)
    - source_labels: [{_meta(labels.ROLE)}]
      regex: prefill|decode|worker
      action: keep
    - source_labels: [__meta_kubernetes_pod_ip, __meta_kubernetes_pod_annotation_prometheus_io_port]
      regex: (.+);(\\d+)
      replacement: $1:$2
      target_label: __address__
    - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
      regex: (.+)
      target_label: __metrics_path__
    - source_labels: [__meta_kubernetes_namespace]
      target_label: {NAMESPACE_LABEL}
    - source_labels: [__meta_kubernetes_pod_name]
      target_label: {POD_LABEL}
    - source_labels: [{_meta(labels.DEPLOYMENT)}]
      target_label: {DEPLOYMENT_LABEL}
    - source_labels: [{_meta(labels.ROLE)}]
      target_label: {ROLE_LABEL}
"""


def _quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(namespace: str, deployment: str) -> str:
    """The label matchers that scope a query to one DisaggregatedDeployment's pods."""
    if not namespace or not deployment:
        raise ValueError(f"namespace and deployment must be non-empty, got {namespace!r}, {deployment!r}")
    return f"{NAMESPACE_LABEL}={_quote(namespace)},{DEPLOYMENT_LABEL}={_quote(deployment)}"


def _fresh(metric: str, sel: str, stale_after: float) -> str:
    """Only the series whose newest sample is at most ``stale_after`` seconds old."""
    return f"({metric}{{{sel}}} and (time() - timestamp({metric}{{{sel}}})) <= {stale_after:g})"


def pool_queries(
    namespace: str, deployment: str, stale_after: float, window: str = RATE_WINDOW, metrics: MetricNames = VLLM_METRICS
) -> dict[str, str]:
    """One instant query per observation field, each answering one value per ``xpyd_role``, in the names of
    the deployment's engine (``xpyd_api.engines.METRICS``)."""
    sel = selector(namespace, deployment)
    by = f"by ({ROLE_LABEL})"
    by_le = f"by ({ROLE_LABEL}, le)"
    waiting, running, usage = metrics.waiting, metrics.running, metrics.kv_usage[0]
    return {
        "waiting": f"sum {by} {_fresh(waiting, sel, stale_after)}",
        "running": f"sum {by} {_fresh(running, sel, stale_after)}",
        "kv_usage": f"avg {by} {_fresh(usage, sel, stale_after)}",
        # pods (replicas; a multi-node group's leader), not series: a data-parallel engine has one per rank
        "reporting": f"count {by} (count by ({ROLE_LABEL}, {POD_LABEL}) {_fresh(waiting, sel, stale_after)})",
        "sampled_at": f"max {by} (timestamp({waiting}{{{sel}}}))",
        "ttft_p90": f"histogram_quantile(0.9, sum {by_le} (rate({metrics.ttft}_bucket{{{sel}}}[{window}])))",
        "itl_p90": f"histogram_quantile(0.9, sum {by_le} (rate({metrics.itl}_bucket{{{sel}}}[{window}])))",
        "prompt_tokens_rate": f"sum {by} (irate({metrics.prompt_tokens}{{{sel}}}[{window}]))",
        # the SLO policy's: output tokens/s, requests/s through the pool, the prefix cache's hit ratio
        "generation_tokens_rate": f"sum {by} (irate({metrics.generation_tokens}{{{sel}}}[{window}]))",
        "request_rate": f"sum {by} (irate({metrics.ttft}_count{{{sel}}}[{window}]))",
        **({"prefix_hit_ratio": hit} if (hit := _hit_ratio(metrics, sel, by, window)) else {}),
        **_prompt_quantiles(metrics, sel, by_le, window),
    }


def _prompt_quantiles(metrics: MetricNames, sel: str, by_le: str, window: str) -> dict[str, str]:
    """The prompt length at each of PROMPT_QUANTILES over the window, where the engine exports its histogram."""
    if not metrics.prompt_length:
        return {}
    rate = f"sum {by_le} (rate({metrics.prompt_length}_bucket{{{sel}}}[{window}]))"
    return {f"prompt_tokens_p{round(q * 100)}": f"histogram_quantile({q:g}, {rate})" for q in PROMPT_QUANTILES}


def _hit_ratio(metrics: MetricNames, sel: str, by: str, window: str) -> str | None:
    """The prefix cache's hit ratio: hits / queries (vLLM), else the engine's own 0-1 gauge (SGLang)."""
    if metrics.prefix_hits and metrics.prefix_queries:
        hits = f"sum {by} (rate({metrics.prefix_hits}{{{sel}}}[{window}]))"
        return f"{hits} / sum {by} (rate({metrics.prefix_queries}{{{sel}}}[{window}]))"
    if metrics.cache_hit_rate:
        return f"avg {by} ({metrics.cache_hit_rate}{{{sel}}})"
    return None


def router_selector(namespace: str, deployment: str) -> str:
    """The label matchers that scope a query to one DisaggregatedDeployment's routers (their own label)."""
    return f"{NAMESPACE_LABEL}={_quote(namespace)},deployment={_quote(deployment)}"


def held_query(namespace: str, deployment: str) -> str:
    """The requests the deployment's routers hold for a worker to start (one value, every replica summed)."""
    return f"sum({names.ROUTER_HELD}{{{router_selector(namespace, deployment)}}})"
