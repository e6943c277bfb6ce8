"""Every Prometheus metric name xpyd reads or writes, so exporters and consumers cannot drift apart.

The worker's names are vLLM's (docs/operate.md, "Metrics"): the router scrapes them, the autoscaler queries
them through Prometheus, the dashboards plot them and the emulator exports them. xpyd's own names
(`xpyd_` prefix) are exported by the router, the operator's autoscaler and the emulator, and read
by the dashboards. Counters carry their `_total` suffix as exposed; histograms are named without
`_bucket`. `tests/dashboards/test_metric_contract.py` scrapes the real exporters for each of them.
"""

from __future__ import annotations

from typing import Final

# --- the labels Prometheus gives every scraped worker and router series (the scrape config's relabeling:
# namespace and pod from the target, the pod labels xpyd.io/deployment and xpyd.io/role renamed) ---
NAMESPACE_LABEL: Final = "namespace"
POD_LABEL: Final = "pod"
POD_DEPLOYMENT: Final = "xpyd_deployment"
POD_ROLE: Final = "xpyd_role"

# --- vLLM worker metrics ---
WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
KV_USAGE: Final = "vllm:kv_cache_usage_perc"  # 0-1
KV_USAGE_OLD: Final = "vllm:gpu_cache_usage_perc"  # older vLLM name of the same gauge
CACHE_CONFIG: Final = "vllm:cache_config_info"  # labels block_size, num_gpu_blocks
PREFIX_QUERIES: Final = "vllm:prefix_cache_queries_total"  # tokens
PREFIX_HITS: Final = "vllm:prefix_cache_hits_total"  # tokens
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
PREEMPTIONS: Final = "vllm:num_preemptions_total"
REQUEST_SUCCESS: Final = "vllm:request_success_total"  # label finished_reason
TTFT: Final = "vllm:time_to_first_token_seconds"  # histogram
ITL: Final = "vllm:inter_token_latency_seconds"  # histogram
E2E: Final = "vllm:e2e_request_latency_seconds"  # histogram
QUEUE_TIME: Final = "vllm:request_queue_time_seconds"  # histogram
PROMPT_LENGTH: Final = "vllm:request_prompt_tokens"  # histogram of each finished request's prompt tokens


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's buckets for a request's token counts (vllm:request_prompt_tokens): 1, 2, 5, 10, 20, 50, ... up
    to max_model_len."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


# --- SGLang's names for the same gauges (the router's scraper reads both engines) ---
SGL_WAITING: Final = "sglang:num_queue_reqs"
SGL_RUNNING: Final = "sglang:num_running_reqs"
SGL_USAGE: Final = "sglang:token_usage"
# each finished request's prompt tokens: with --enable-metrics from 0.5.23, with --collect-tokens-histogram too before
SGL_PROMPT_LENGTH: Final = "sglang:prompt_tokens_histogram"

# --- the router's own (label deployment) ---
ROUTER_REQUESTS: Final = "xpyd_router_requests_total"
ROUTER_HOP_LATENCY: Final = "xpyd_router_hop_latency_seconds"  # histogram
ROUTER_DECISIONS: Final = "xpyd_router_decisions_total"
ROUTER_PROMPT_BLOCKS: Final = "xpyd_router_prompt_blocks_total"
ROUTER_PREFIX_HIT_RATIO: Final = "xpyd_router_prefix_hit_ratio"
ROUTER_KV_HANDOFFS: Final = "xpyd_router_kv_handoffs_total"
ROUTER_ERRORS: Final = "xpyd_router_errors_total"
ROUTER_RETRIES: Final = "xpyd_router_retries_total"
ROUTER_WORKERS: Final = "xpyd_router_workers"
ROUTER_REVISION_WORKERS: Final = "xpyd_router_revision_workers"  # ready workers per engine revision and role
ROUTER_PAIRABLE: Final = "xpyd_router_pairable_workers"  # ready workers of the scarcer role, summed over revisions
ROUTER_PAIR_WARMUPS: Final = "xpyd_router_pair_warmups_total"  # warm-up handoffs by outcome (done, failed, ...)
ROUTER_PAIR_WARMUPS_RUNNING: Final = "xpyd_router_pair_warmups_running"  # warm-up handoffs in flight now
ROUTER_INFLIGHT: Final = "xpyd_router_inflight_requests"
ROUTER_TOKENIZER_LOADED: Final = "xpyd_router_tokenizer_loaded"  # 1: prompts keyed by the engines' tokens
ROUTER_KV_EVENT_BATCHES: Final = "xpyd_router_kv_event_batches_total"  # per worker (data-parallel rank)
ROUTER_KV_EVENT_BLOCKS: Final = "xpyd_router_kv_event_blocks_total"  # per worker and outcome
ROUTER_PEERS: Final = "xpyd_router_peers"  # the other router replicas this one exchanges with
ROUTER_PEERS_SHARING_ROUTES: Final = "xpyd_router_peers_sharing_routes"  # 1: every peer passes on its routes
ROUTER_PEER_ROUTES: Final = "xpyd_router_peer_routes_total"  # peers' routes recorded in the index
# per prefill/decode pair (labels prefill, decode: the workers' target names): the KV data path
ROUTER_HANDOFF_LATENCY: Final = "xpyd_router_handoff_latency_seconds"  # histogram: prefill end -> decode first byte
ROUTER_HANDOFF_BYTES: Final = "xpyd_router_handoff_bytes_total"  # prompt tokens x --kv-bytes-per-token
ROUTER_HANDOFF_FAILURES: Final = "xpyd_router_handoff_failures_total"  # decode legs failed after prefill; label stage
ROUTER_HANDOFF_RETRIES: Final = "xpyd_router_handoff_retries_total"  # requests retried after their pair failed
ROUTER_PAIRS_COOLING: Final = "xpyd_router_pairs_cooling_off"  # pairs out of pairing now
ROUTER_PAIR_TRIPS: Final = "xpyd_router_pair_trips_total"  # pairs taken out of pairing; label reason
ROUTER_HANDOFF_BREAKEVEN: Final = "xpyd_router_handoff_breakeven_seconds"  # --handoff-slow-seconds (0: off)
ROUTER_HELD: Final = "xpyd_router_held_requests"  # requests waiting for a worker (a pool at zero): wakes it
ROUTER_HOLD_OUTCOMES: Final = "xpyd_router_hold_outcomes_total"  # held requests by outcome: served, timeout, full
ROUTER_HOLD_WAIT: Final = "xpyd_router_hold_wait_seconds"  # histogram: how long a served held request waited

# --- the operator's autoscaler (labels namespace, deployment, role) ---
AUTOSCALER_DESIRED: Final = "xpyd_autoscaler_desired_replicas"
AUTOSCALER_ACTUAL: Final = "xpyd_autoscaler_actual_replicas"
AUTOSCALER_REASON: Final = "xpyd_autoscaler_decision_reason"  # 1 for the last decision's reason
AUTOSCALER_HEALTHY: Final = "xpyd_autoscaler_healthy"
AUTOSCALER_SCALE_EVENTS: Final = "xpyd_autoscaler_scale_events_total"
AUTOSCALER_SLO_CORRECTION: Final = "xpyd_autoscaler_slo_model_correction"  # observed / predicted latency
AUTOSCALER_SLO_PREDICTED: Final = "xpyd_autoscaler_slo_predicted_attainment"  # of the last decision, 0..1
AUTOSCALER_READY_SECONDS: Final = "xpyd_autoscaler_replica_ready_seconds"  # measured time to Ready
# spec.slo as the autoscaler runs it (labels namespace, deployment; the targets also latency: ttft, itl)
AUTOSCALER_SLO_TARGET: Final = "xpyd_autoscaler_slo_target_seconds"  # spec.slo.ttftSeconds / itlSeconds
AUTOSCALER_SLO_PERCENTILE: Final = "xpyd_autoscaler_slo_percentile"  # spec.slo.percentile: 90, 95 or 99
AUTOSCALER_SLO_GOAL: Final = "xpyd_autoscaler_slo_attainment_goal"  # spec.slo.attainment, 0..1
AUTOSCALER_WAKES: Final = "xpyd_autoscaler_wakes_total"  # pools started from zero for requests the router held

# --- the worker emulator's own ---
EMULATOR_PREFIX_INDEX_BLOCKS: Final = "xpyd_emulator_prefix_index_blocks"
EMULATOR_CPU_TIER_HITS: Final = "xpyd_emulator_cpu_tier_hits_total"  # prompt tokens loaded from the CPU tier
EMULATOR_CPU_TIER_BLOCKS: Final = "xpyd_emulator_cpu_tier_blocks"  # blocks in the CPU tier
