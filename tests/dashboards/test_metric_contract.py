"""The dashboards query only metrics and labels the operator, router and emulator really export."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xpyd_dashboards import all_queries
from xpyd_dashboards import metrics as m
from xpyd_operator import autoscaling_promql

REPO = Path(__file__).resolve().parents[2]
EXPORTERS = ("operator", "router", "emulator")
_METRIC = re.compile(r"\b((?:vllm:|xpyd_)[a-z_:]+)(?=\{|\s*\)|\[)")


def _sources() -> str:
    return "\n".join(p.read_text() for root in EXPORTERS for p in sorted((REPO / root).rglob("*.py")))


SOURCES = _sources()


def _used_metrics() -> set[str]:
    return {name for q in all_queries() for name in _METRIC.findall(q.expr)}


def test_queries_use_the_named_metrics() -> None:
    used = _used_metrics()
    assert m.VLLM_WAITING in used
    assert m.AUTOSCALER_DESIRED in used
    assert m.ROUTER_KV_HANDOFFS in used


@pytest.mark.parametrize("metric", sorted(_used_metrics()))
def test_metric_is_exported_somewhere(metric: str) -> None:
    base = re.sub(r"_(bucket|total)$", "", metric)
    assert f'"{base}' in SOURCES, f"{metric}: no exporter in {EXPORTERS} names {base!r}"


def test_scrape_labels_match_the_autoscaler() -> None:
    assert m.POD_DEPLOYMENT == autoscaling_promql.DEPLOYMENT_LABEL
    assert m.POD_ROLE == autoscaling_promql.ROLE_LABEL
    assert autoscaling_promql.NAMESPACE_LABEL == "namespace"
