"""Parsing the vLLM (and SGLang) /metrics series the router routes on."""

from __future__ import annotations

import pytest

from xpyd_router.scrape import parse_metrics

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:prefix_cache_hits_total{model_name="m"} 100.0
"""


@pytest.mark.parametrize(
    ("text", "waiting", "running", "usage", "capacity"),
    [
        (VLLM, 3.0, 7.0, 0.25, 16 * 2048),
        ("", 0.0, 0.0, 0.0, 0),
        ('garbage line\nvllm:num_requests_waiting{x="1"} notanumber\n', 0.0, 0.0, 0.0, 0),
        ("vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting 1\n", 1.0, 0.0, 0.5, 0),
        (
            'sglang:num_queue_reqs{m="a"} 4\nsglang:num_running_reqs 6\nsglang:token_usage 0.7\n',
            4.0,
            6.0,
            0.7,
            0,
        ),
    ],
)
def test_parse(text: str, waiting: float, running: float, usage: float, capacity: int) -> None:
    m = parse_metrics(text)
    assert (m.waiting, m.running, m.kv_usage, m.capacity_tokens) == (waiting, running, usage, capacity)
