"""The chart's alert expressions run in a real Prometheus (the local cluster's build) over stand-in routers' series."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from realprom import running, serve_pages, stop_pages  # type: ignore[import-not-found]  # tests/ is on sys.path
from xpyd_api import metric_names as names
from xpyd_chart.helm import one, template

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("helm")]


def router(pairable: int, workers: dict[tuple[str, str], int]) -> str:
    """One router replica's /metrics: its pairable capacity and its workers by (role, state)."""
    lines = [f"# TYPE {names.ROUTER_PAIRABLE} gauge", f"# TYPE {names.ROUTER_WORKERS} gauge"]
    lines.append(f'{names.ROUTER_PAIRABLE}{{deployment="DD"}} {pairable}')
    for role in ("prefill", "decode"):
        for state in ("ready", "draining", "unhealthy"):
            n = workers.get((role, state), 0)
            lines.append(f'{names.ROUTER_WORKERS}{{deployment="DD",role="{role}",state="{state}"}} {n}')
    return "\n".join(lines) + "\n"


READY = {("prefill", "ready"): 2, ("decode", "ready"): 2}
# deployment -> its router replicas' /metrics, and whether XpydNoPairableWorkers must fire for it
DEPLOYMENTS: dict[str, tuple[list[str], bool]] = {
    "rolled-apart": ([router(0, READY)], True),  # one revision in prefill, another in decode
    "prefill-down": ([router(0, {("prefill", "unhealthy"): 2, ("decode", "ready"): 2})], True),
    "both-routers-blind": ([router(0, READY), router(0, READY)], True),
    "paired": ([router(2, READY)], False),
    "one-router-pairs": ([router(0, READY), router(1, READY)], False),  # no router *can* pair: max over replicas
    "scaled-to-zero": ([router(0, {})], False),
    "decode-only": ([router(0, {("decode", "ready"): 3})], False),
}


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    servers, targets = [], []
    for deployment, (routers, _) in DEPLOYMENTS.items():
        for i, text in enumerate(routers):
            page = text.replace('deployment="DD"', f'deployment="{deployment}"')
            httpd = serve_pages({"/metrics": lambda page=page: page})
            servers.append(httpd)
            port = httpd.server_address[1]
            targets.append(
                {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "ns", "pod": f"{deployment}-{i}"}}
            )
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "routers", "static_configs": targets}],
    }
    try:
        with running(tmp_path, config) as url:
            yield url
    finally:
        for httpd in servers:
            stop_pages(httpd)


def query(base: str, expr: str) -> list[dict[str, str]]:
    """The series an instant query returns (their labels); AssertionError if Prometheus refuses the expression."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            doc = json.load(reply)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"Prometheus refused {expr!r}: {exc.read().decode()}") from None
    assert doc["status"] == "success", doc
    return [s["metric"] for s in doc["data"]["result"]]


def wait_scraped(base: str, up: int, tries: int = 120) -> None:
    """Until every stand-in router is scraped (at most tries x 0.25 s); the first tries may find no server yet."""
    for _ in range(tries):
        try:
            if len(query(base, f"{names.ROUTER_PAIRABLE} and on (pod) up == 1")) == up:
                return
        except (OSError, AssertionError):
            pass
        time.sleep(0.25)
    raise AssertionError(f"Prometheus did not scrape the {up} stand-in routers")


def test_no_pairable_workers_fires_for_the_deployments_that_cannot_pair(prometheus: str) -> None:
    rule = one(template({"metrics.prometheusRule.enabled": "true"}), "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    wait_scraped(prometheus, sum(len(routers) for routers, _ in DEPLOYMENTS.values()))
    firing = {s["deployment"] for s in query(prometheus, alerts["XpydNoPairableWorkers"])}
    assert firing == {d for d, (_, fires) in DEPLOYMENTS.items() if fires}
    for expr in alerts.values():  # every alert's expression is PromQL Prometheus takes
        query(prometheus, expr)
