"""The generated dashboards: committed JSON is current, panels cover the issue, queries substitute cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpyd_dashboards import DASHBOARDS, FEATURES, PanelQuery, Query, all_queries, applicable, substitute
from xpyd_dashboards.build import render
from xpyd_dashboards.cli import TARGETS, main, rendered, stale

REQUIRED_PANELS = (
    "xPyD over time: desired vs actual replicas",
    "Queue length per pool",
    "Time to first token (p50, p99)",
    "Inter-token latency (p50, p99)",
    "KV cache usage",
    "Prefix cache hit ratio",
    "KV handoffs by path",
    "Autoscaler decisions and reasons",
    # the SLO row
    "TTFT: SLO target vs measured",
    "ITL: SLO target vs measured",
    "Predicted SLO attainment vs goal",
    "Performance model correction per pool",
    "Replicas chosen per pool",
    "Time to serve a new replica",
    "Requests held at zero, pools woken",
)


def test_committed_dashboards_are_current() -> None:
    assert stale() == [], "run: .venv/bin/python -m xpyd_dashboards"


def test_check_flags_a_stale_copy(tmp_path: Path) -> None:
    (tmp_path / "xpyd-deployment.json").write_text("{}\n")
    assert stale((tmp_path,)) == [tmp_path / "xpyd-deployment.json"]
    (tmp_path / "xpyd-deployment.json").write_text(rendered()["xpyd-deployment.json"])
    assert stale((tmp_path,)) == []


def test_cli_check_passes_on_the_repo() -> None:
    assert main(["--check"]) == 0


def test_targets_include_the_chart() -> None:
    assert any(p.parts[-3:] == ("charts", "xpyd-operator", "dashboards") for p in TARGETS)


@pytest.mark.parametrize("title", REQUIRED_PANELS)
def test_required_panel_present(title: str) -> None:
    titles = {q.title for q in all_queries()}
    assert title in titles


def test_render_is_deterministic_and_valid_json() -> None:
    for spec in DASHBOARDS:
        text = render(spec)
        assert text == render(spec)
        doc = json.loads(text)
        assert doc["uid"] == spec.uid
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names == ["datasource", "namespace", "deployment"]
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))


def test_panels_do_not_overlap() -> None:
    doc = json.loads(render(DASHBOARDS[0]))
    cells: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_every_query_filters_by_the_selected_deployment() -> None:
    for q in all_queries():
        assert '"$namespace"' in q.expr, q
        assert "$deployment" in q.expr, q


@pytest.mark.parametrize("query", all_queries(), ids=lambda q: f"{q.title}/{q.legend}")
def test_queries_substitute_and_balance(query: PanelQuery) -> None:
    expr = substitute(query.expr, namespace="demo", deployment="llama")
    assert "$namespace" not in expr
    assert "$deployment" not in expr
    assert "$__rate_interval" not in expr
    for open_, close in ("()", "{}", "[]"):
        assert expr.count(open_) == expr.count(close), expr
    assert expr.count('"') % 2 == 0


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ('m{namespace="$namespace"}', 'm{namespace="ns"}'),
        ('m{deployment="${deployment}"}', 'm{deployment="dd"}'),
        ("rate(m[$__rate_interval])", "rate(m[2m])"),
        (
            'label_replace(m, "role", "$1", "pod", "$deployment-(a)")',
            'label_replace(m, "role", "$1", "pod", "dd-(a)")',
        ),
    ],
)
def test_substitute(expr: str, want: str) -> None:
    assert substitute(expr, namespace="ns", deployment="dd", rate_interval="2m") == want


def test_substitute_rejects_unknown_variables() -> None:
    with pytest.raises(ValueError, match=r"unknown Grafana variable \$cluster"):
        substitute('m{cluster="$cluster"}', namespace="ns", deployment="dd")


@pytest.mark.parametrize(
    ("features", "want"),
    [
        ((), {""}),
        (("slo",), {"", "slo"}),
        (("slo", "scale-to-zero"), {"", "slo", "scale-to-zero"}),
    ],
)
def test_applicable_leaves_out_queries_of_features_not_named(features: tuple[str, ...], want: set[str]) -> None:
    assert {q.needs for q in applicable(all_queries(), features)} == want


def test_features_are_known() -> None:
    assert set(FEATURES) == {q.needs for q in all_queries()} - {""}
    with pytest.raises(ValueError, match="unknown features"):
        applicable(all_queries(), ["slos"])
    with pytest.raises(ValueError, match="unknown feature"):
        Query("x", "y", "slos")


def test_slo_row_reads_the_autoscalers_slo_series() -> None:
    row = next(r for r in DASHBOARDS[0].rows if r.title == "SLO")
    exprs = " ".join(q.expr for p in row.panels for q in p.queries)
    for name in (
        "xpyd_autoscaler_slo_target_seconds",
        "xpyd_autoscaler_slo_percentile",
        "xpyd_autoscaler_slo_attainment_goal",
        "xpyd_autoscaler_slo_predicted_attainment",
        "xpyd_autoscaler_slo_model_correction",
        "xpyd_autoscaler_desired_replicas",
        "xpyd_autoscaler_replica_ready_seconds",
        "xpyd_router_held_requests",
        "xpyd_router_hold_outcomes_total",
        "xpyd_autoscaler_wakes_total",
    ):
        assert name in exprs, name
