"""Every dashboard panel's PromQL, run against the real Prometheus after a load run: none may error or be empty.

Needs PROMETHEUS_URL (e.g. http://127.0.0.1:9090) and load having gone through the deployments
first (the demo's load run does). Deployments: XPYD_DASHBOARD_DEPLOYMENTS="ns/name,ns/name", else
every DisaggregatedDeployment in the cluster named by KUBECONFIG. Window: the panels' series over
the last XPYD_DASHBOARD_WINDOW seconds (default 900), as Grafana would draw them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from xpyd_chart.helm import kubectl_binary
from xpyd_dashboards import PanelQuery, all_queries, substitute

pytestmark = [pytest.mark.e2e]

STEP_SECONDS = 15


def _prometheus() -> str:
    url = os.environ.get("PROMETHEUS_URL", "")
    if not url:
        pytest.skip("PROMETHEUS_URL is not set: run this after a load run (make demo does)")
    return url.rstrip("/")


def _deployments() -> list[tuple[str, str]]:
    named = os.environ.get("XPYD_DASHBOARD_DEPLOYMENTS", "")
    if named:
        pairs = [item.strip().split("/", 1) for item in named.split(",") if item.strip()]
        for pair in pairs:
            assert len(pair) == 2, f"XPYD_DASHBOARD_DEPLOYMENTS entries are namespace/name, got {pair}"
        return [(ns, name) for ns, name in pairs]
    binary = kubectl_binary()
    assert binary is not None, "kubectl not found (set KUBECONFIG and KUBECTL)"
    cmd = [binary, "get", "disaggregateddeployments.xpyd.io", "-A", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    items = json.loads(out)["items"]
    assert items, "no DisaggregatedDeployment in the cluster: the dashboards have nothing to show"
    return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]


def _window() -> float:
    raw = os.environ.get("XPYD_DASHBOARD_WINDOW", "900")
    seconds = float(raw)
    assert seconds > STEP_SECONDS, f"XPYD_DASHBOARD_WINDOW must exceed {STEP_SECONDS}s, got {raw}"
    return seconds


def run_range(client: httpx.Client, expr: str, window: float) -> list[dict[str, object]]:
    """The query over the window; raises AssertionError naming Prometheus's error."""
    end = time.time()
    params = {"query": expr, "start": f"{end - window:.3f}", "end": f"{end:.3f}", "step": f"{STEP_SECONDS}s"}
    response = client.get("/api/v1/query_range", params=params)
    body = response.json()
    assert response.status_code == 200, f"HTTP {response.status_code}: {body.get('error')} in {expr}"
    assert body["status"] == "success", f"{body.get('errorType')}: {body.get('error')} in {expr}"
    result: list[dict[str, object]] = body["data"]["result"]
    return result


@pytest.mark.parametrize("query", all_queries(), ids=lambda q: f"{q.title} / {q.legend}")
def test_panel_query_returns_data(query: PanelQuery) -> None:
    window = _window()
    with httpx.Client(base_url=_prometheus(), timeout=30) as client:
        empty = []
        for namespace, name in _deployments():
            expr = substitute(query.expr, namespace=namespace, deployment=name, rate_interval="1m")
            if not run_range(client, expr, window):
                empty.append(f"{namespace}/{name}: {expr}")
    assert not empty, f"panel {query.title!r} ({query.legend}) returned nothing for " + "; ".join(empty)
