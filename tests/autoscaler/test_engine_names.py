"""The autoscaler asks Prometheus in the deployment's engine's own metric names (xpyd_api.engines.METRICS)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from xpyd_api import engines
from xpyd_operator.autoscaling.promql import pool_queries

_ENGINE_NAME = re.compile(r"\b((?:vllm|sglang):[a-z_:]+)")


@pytest.mark.parametrize("kind", ["vllm", "sglang", "emulator"])
def test_every_query_reads_only_its_engines_names(kind: str) -> None:
    names = engines.METRICS[kind]
    queries = pool_queries("ns", "dd", 60.0, metrics=names)
    read = {n for q in queries.values() for n in _ENGINE_NAME.findall(q)}
    prefix = "sglang:" if kind == "sglang" else "vllm:"
    assert read and all(n.startswith(prefix) for n in read), read
    assert {names.waiting, names.running, names.kv_usage[0], names.prompt_tokens} <= read
    assert {names.ttft + "_bucket", names.itl + "_bucket"} <= read


def test_sglang_pools_are_read_by_sglangs_names() -> None:
    queries = pool_queries("ns", "dd", 60.0, metrics=engines.METRICS["sglang"])
    assert "sglang:num_queue_reqs" in queries["waiting"] and "sglang:num_running_reqs" in queries["running"]
    assert "sglang:token_usage" in queries["kv_usage"] and "vllm:" not in "".join(queries.values())


@pytest.mark.parametrize(
    ("kind", "histogram"),
    [
        ("vllm", "vllm:request_prompt_tokens"),
        ("sglang", "sglang:prompt_tokens_histogram"),
        ("emulator", "vllm:request_prompt_tokens"),  # the emulator speaks vLLM's names
    ],
)
def test_the_prompt_mix_is_read_from_each_engines_prompt_length_histogram(kind: str, histogram: str) -> None:
    queries = pool_queries("ns", "dd", 60.0, metrics=engines.METRICS[kind])
    mix = {k: q for k, q in queries.items() if k.startswith("prompt_tokens_p")}
    assert sorted(mix) == ["prompt_tokens_p50", "prompt_tokens_p90", "prompt_tokens_p99"]
    assert all(f"{histogram}_bucket{{" in q and q.startswith("histogram_quantile(") for q in mix.values()), mix


def test_an_engine_without_the_histogram_leaves_the_mix_unread() -> None:
    names = dataclasses.replace(engines.METRICS["sglang"], prompt_length=None)
    assert not [k for k in pool_queries("ns", "dd", 60.0, metrics=names) if k.startswith("prompt_tokens_p")]
