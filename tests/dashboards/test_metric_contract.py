"""Every metric the router, the autoscaler and the dashboards read is one that a real exporter exposes.

Worker metrics are checked against the emulator's real `/metrics` (a worker process, scraped over
HTTP); xpyd's own against the router's and the autoscaler's registries as Prometheus would scrape them.
A consumer that names a metric nobody exports fails here, whatever the source code says.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from xpyd_api import metric_names as names
from xpyd_dashboards import all_queries
from xpyd_operator.autoscaling.metrics import AutoscalerMetrics
from xpyd_operator.autoscaling.promql import pool_queries
from xpyd_router import scrape
from xpyd_router.hold import ColdHold
from xpyd_router.metrics import RouterMetrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_NAME = re.compile(r"\b((?:vllm:|xpyd_)[a-z_:]+)(?=\{|\s*\)|\[)")


def _names_in(promql: str) -> set[str]:
    """The metric names a PromQL expression reads (the scrape labels look alike and are left out)."""
    return set(_NAME.findall(promql)) - {names.POD_DEPLOYMENT, names.POD_ROLE}


# (consumer, metric it reads): the consumers' own code says which.
CONSUMED: list[tuple[str, str]] = sorted(
    {("router", n) for n in (scrape.WAITING, scrape.RUNNING, scrape.KV_USAGE, scrape.CACHE_CONFIG)}
    | {("autoscaler", n) for q in pool_queries("ns", "dd", 60.0).values() for n in _names_in(q)}
    | {("dashboards", n) for q in all_queries() for n in _names_in(q.expr)}
)


def _sample_names(text: str) -> set[str]:
    """The sample names of a Prometheus text exposition (`_bucket`, `_total`... as scraped)."""
    out = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            out.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return out


@pytest.fixture(scope="module")
def worker_metrics(emulate: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    """The /metrics text of a real emulated vLLM worker process after it served one request (with a KV
    connector, as the pools of a disaggregated deployment run: its NIXL series are exported then)."""
    with emulate(MODEL, "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}') as url:
        body = {"model": MODEL, "prompt": "hello " * 64, "max_tokens": 4}
        httpx.post(url + "/v1/completions", json=body, timeout=60).raise_for_status()
        yield httpx.get(url + "/metrics", timeout=10).text


@pytest.fixture(scope="module")
def exposed(worker_metrics: str) -> set[str]:
    """Every sample name the worker, the router and the autoscaler expose."""
    router = RouterMetrics("dd", CollectorRegistry())
    router.kv_events(dict)  # as a router with a tokenizer exports them: per worker, none subscribed yet
    router.hold(ColdHold(1.0))  # as the router of a deployment that may scale to zero (--hold-seconds)
    autoscaler_registry = CollectorRegistry()
    AutoscalerMetrics(autoscaler_registry)
    own = set()
    for registry in (router.registry, autoscaler_registry):
        for family in registry.collect():  # labelled families without samples yet: their scraped names
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            own |= {family.name + s for s in suffixes}
        own |= _sample_names(generate_latest(registry).decode())
    return _sample_names(worker_metrics) | own


def test_every_consumer_reads_something() -> None:
    consumers = {c for c, _ in CONSUMED}
    assert consumers == {"router", "autoscaler", "dashboards"}
    assert ("dashboards", names.ROUTER_KV_HANDOFFS) in CONSUMED
    assert ("dashboards", names.AUTOSCALER_DESIRED) in CONSUMED
    assert ("autoscaler", f"{names.TTFT}_bucket") in CONSUMED


@pytest.mark.parametrize(("consumer", "metric"), CONSUMED, ids=[f"{c}:{m}" for c, m in CONSUMED])
def test_consumed_metric_is_exposed(consumer: str, metric: str, exposed: set[str]) -> None:
    assert metric in exposed, f"{consumer} reads {metric}, which no exporter exposes"


def test_the_router_parses_the_workers_cache_config(worker_metrics: str) -> None:
    seen = scrape.parse_metrics(worker_metrics)
    assert seen.block_size > 0
    assert seen.num_gpu_blocks > 0


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('vllm:num_requests_waiting{engine="0"} 1.0\n# HELP x y\n', {"vllm:num_requests_waiting"}),
        ("xpyd_router_inflight_requests 2\n", {"xpyd_router_inflight_requests"}),
        ('a_bucket{le="+Inf"} 3\na_count 3\n', {"a_bucket", "a_count"}),
    ],
)
def test_sample_names_are_read_as_scraped(text: str, want: set[str]) -> None:
    assert _sample_names(text) == want
