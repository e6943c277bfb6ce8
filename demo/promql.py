"""Range queries against Prometheus's HTTP API, shared by the demo's plot and its checks."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

READY = 'count by (xpyd_role) (up{{xpyd_deployment="{d}", xpyd_role=~"prefill|decode"}} == 1)'


def query_range(prom: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{params}", timeout=10) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    return list(body["data"]["result"])


def by_role(series: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Values of each series keyed by its role label (xpyd_role on scraped series, role on ours)."""
    out: dict[str, list[float]] = {}
    for s in series:
        role = s["metric"].get("xpyd_role") or s["metric"].get("role", "?")
        out[role] = [float(v) for _, v in s["values"]]
    return out
