"""Every panel's PromQL against a real Prometheus: each parses and runs, and the SLO row has data once
Prometheus scrapes an autoscaler that ran an SLO decision and workers with latency histograms."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from realprom import running, serve_pages, stop_pages  # type: ignore[import-not-found]  # tests/ is on sys.path
from xpyd_api.models import SloSpec
from xpyd_dashboards import all_queries, applicable, substitute
from xpyd_dashboards.panels import SLO
from xpyd_operator.autoscaling.metrics import AutoscalerMetrics
from xpyd_operator.autoscaling.types import Decision, PoolDecision, PoolState

pytestmark = pytest.mark.slow
NS, NAME = "ns", "llama"


class _Clock:
    """Seconds since the exporters started: the histograms' counts grow with it, so rates are positive."""

    def __init__(self) -> None:
        self.start = time.time()

    def up(self) -> float:
        return time.time() - self.start


def _worker_text(clock: _Clock) -> str:
    """A worker's TTFT and ITL histograms, every observation in the bucket just under 0.5 s / 0.05 s."""
    n = 10.0 * clock.up()
    lines = []
    for name, low, high in (
        ("vllm:time_to_first_token_seconds", 0.25, 0.5),
        ("vllm:inter_token_latency_seconds", 0.025, 0.05),
    ):
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{le="{low}"}} 0',
            f'{name}_bucket{{le="{high}"}} {n:.3f}',
            f'{name}_bucket{{le="+Inf"}} {n:.3f}',
            f"{name}_count {n:.3f}",
            f"{name}_sum {n * high:.3f}",
        ]
    return "\n".join(lines) + "\n"


def _autoscaler_text() -> str:
    """The autoscaler's registry after one SLO decision for ns/llama."""
    registry = CollectorRegistry()
    metrics = AutoscalerMetrics(registry)
    learnt = PoolState(correction=1.4, predicted=0.995, ready_seconds=42.0)
    decision = Decision(
        pools={r: PoolDecision(2, "scale-up", "slo") for r in ("prefill", "decode")},
        healthy=True,
        health_reason="MetricsFresh",
        health_message="",
        state={"prefill": learnt, "decode": learnt},
    )
    slo = SloSpec(ttft_seconds=1.0, itl_seconds=0.05, percentile=95, attainment=0.99)
    metrics.record(NS, NAME, decision, {"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, slo)
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    clock = _Clock()
    autoscaler = _autoscaler_text()
    server = serve_pages({"/worker": lambda: _worker_text(clock), "/autoscaler": lambda: autoscaler})
    port = server.server_address[1]
    workers = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {"namespace": NS, "pod": f"{NAME}-{role}-0", "xpyd_deployment": NAME, "xpyd_role": role},
        }
        for role in ("prefill", "decode")
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            # two targets at one address: a pod label of each keeps them apart
            {"job_name": f"worker-{i}", "metrics_path": "/worker", "static_configs": [target]}
            for i, target in enumerate(workers)
        ]
        + [
            {
                "job_name": "operator",
                "metrics_path": "/autoscaler",
                "honor_labels": True,  # the autoscaler's series carry the namespace they describe
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
        ],
    }
    try:
        with running(tmp_path_factory.mktemp("prometheus"), config) as url:
            yield url
    finally:
        stop_pages(server)


def _query(client: httpx.Client, expr: str) -> dict[str, object]:
    """Prometheus's answer to an instant query (any HTTP status: a parse error is a 400 with a body)."""
    body: dict[str, object] = client.get("/api/v1/query", params={"query": expr}).json()
    return body


def _expr(raw: str) -> str:
    return substitute(raw, namespace=NS, deployment=NAME, rate_interval="5s")


def test_every_panel_query_parses_and_runs(prometheus: str) -> None:
    with httpx.Client(base_url=prometheus, timeout=10) as client:
        for q in all_queries():
            answer = _query(client, _expr(q.expr))
            assert answer.get("status") == "success", f"{q.title} / {q.legend}: {answer.get('error')}"


def _series(client: httpx.Client, expr: str) -> list[dict[str, object]]:
    data = _query(client, _expr(expr)).get("data")
    result = data.get("result") if isinstance(data, dict) else None
    return result if isinstance(result, list) else []


def test_slo_row_has_data_from_the_autoscaler_and_workers(prometheus: str) -> None:
    wanted = [q for q in applicable(all_queries(), [SLO]) if q.needs == SLO]
    assert len(wanted) >= 6  # targets, measured TTFT and ITL, predicted and goal, correction, time to serve
    ttft = next(q for q in wanted if q.title.startswith("TTFT") and q.legend.startswith("measured"))
    missing: list[str] = []
    values: dict[str, float] = {}
    with httpx.Client(base_url=prometheus, timeout=10) as client:
        for _ in range(60):  # a few scrapes of both pools, so that rates over 5 s exist
            missing = [f"{q.title} / {q.legend}" for q in wanted if not _series(client, q.expr)]
            values = {r["metric"]["xpyd_role"]: float(r["value"][1]) for r in _series(client, ttft.expr)}  # type: ignore[index]
            if not missing and len(values) == 2:
                break
            time.sleep(0.5)
    assert not missing, f"no data: {missing}"
    # the measured latency is read at spec.slo.percentile (95): 95% into the (0.25, 0.5] s bucket
    assert values == {"prefill": pytest.approx(0.4875), "decode": pytest.approx(0.4875)}
