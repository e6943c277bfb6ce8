"""The chart's alert expressions run in a real Prometheus (the local cluster's build) over stand-in routers' series."""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
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


BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def handoffs(deployment: str, breakeven: float | None, pairs: dict[str, float]) -> Callable[[], str]:
    """One router replica's /metrics whose pairs' handoffs all land in the bucket up to pairs[decode] seconds (so
    their p99 is just below it), more at each scrape; breakeven: its --handoff-slow-seconds gauge (None: a router
    without the gauge)."""
    scrapes = itertools.count(1)

    def page() -> str:
        n = 10 * next(scrapes)
        lines = [f"# TYPE {names.ROUTER_HANDOFF_LATENCY} histogram"]
        for decode, upper in pairs.items():
            pair = f'deployment="{deployment}",prefill="p0",decode="{decode}"'
            for le in (*BUCKETS, "+Inf"):
                count = n if le == "+Inf" or float(le) >= upper else 0
                lines.append(f'{names.ROUTER_HANDOFF_LATENCY}_bucket{{{pair},le="{le}"}} {count}')
            lines += [f"{names.ROUTER_HANDOFF_LATENCY}_count{{{pair}}} {n}",
                      f"{names.ROUTER_HANDOFF_LATENCY}_sum{{{pair}}} {n * upper}"]  # fmt: skip
        if breakeven is not None:
            lines += [f"# TYPE {names.ROUTER_HANDOFF_BREAKEVEN} gauge",
                      f'{names.ROUTER_HANDOFF_BREAKEVEN}{{deployment="{deployment}"}} {breakeven}']  # fmt: skip
        return "\n".join(lines) + "\n"

    return page


# deployment -> its router replicas' handoff pages; the fixed limit below is the chart's default (2 s)
HANDOFFS: dict[str, list[Callable[[], str]]] = {
    # the operator's break-even (0.2 s): a pair at 0.5 s is over it, one at 0.1 s is not; two router replicas
    "priced": [handoffs("priced", 0.2, {"slow": 0.5, "fast": 0.1}), handoffs("priced", 0.2, {"slow": 0.5})],
    # routers that know no break-even (0: topology Any) or export no gauge (older routers): the fixed 2 s
    "unpriced": [handoffs("unpriced", 0.0, {"slow": 5.0, "fast": 1.0})],
    "old-router": [handoffs("old-router", None, {"slow": 5.0, "fast": 0.5})],
}
# (deployment, decode) XpydKvHandoffSlow must fire for: with the break-even, and with handoffThreshold "fixed"
SLOW_BREAKEVEN = {("priced", "slow"), ("unpriced", "slow"), ("old-router", "slow")}
SLOW_FIXED = {("unpriced", "slow"), ("old-router", "slow")}


def _static(text: str) -> Callable[[], str]:
    return lambda: text


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    servers, targets = [], []
    pages: list[tuple[str, Callable[[], str]]] = [(d, page) for d, routers in HANDOFFS.items() for page in routers]
    for deployment, (routers, _) in DEPLOYMENTS.items():
        for text in routers:
            pages.append((deployment, _static(text.replace('deployment="DD"', f'deployment="{deployment}"'))))
    for i, (deployment, make) in enumerate(pages):
        httpd = serve_pages({"/metrics": make})
        servers.append(httpd)
        port = httpd.server_address[1]
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "ns", "pod": f"{deployment}-{i}"}})
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


def _slow_pairs(base: str, expr: str) -> set[tuple[str, str]]:
    return {(s["deployment"], s["decode"]) for s in query(base, expr) if s["deployment"] in HANDOFFS}


@pytest.mark.parametrize(("threshold", "want"), [("breakeven", SLOW_BREAKEVEN), ("fixed", SLOW_FIXED)])
def test_handoff_slow_fires_for_the_pairs_over_their_deployments_break_even(
    prometheus: str, threshold: str, want: set[tuple[str, str]]
) -> None:
    values = {"metrics.prometheusRule.enabled": "true", "metrics.prometheusRule.handoffThreshold": threshold}
    rule = one(template(values), "PrometheusRule")
    expr = next(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "XpydKvHandoffSlow")
    got: set[tuple[str, str]] = set()
    for _ in range(120):  # until the 5-minute rates have two samples of every stand-in (0.25 s a try)
        got = _slow_pairs(prometheus, expr)
        if got == want:
            break
        time.sleep(0.25)
    assert got == want
    fired = {(s["deployment"], s["decode"]): s for s in query(prometheus, expr) if s["deployment"] in HANDOFFS}
    assert all(set(s) >= {"namespace", "deployment", "prefill", "decode"} for s in fired.values())
