"""The KV data path alerts: a PrometheusRule on demand, over the series the router exports."""

from __future__ import annotations

import re

import pytest

from xpyd_api import metric_names as names
from xpyd_chart.helm import one, template

pytestmark = pytest.mark.usefixtures("helm")
KEY = "metrics.prometheusRule.enabled"


@pytest.mark.parametrize(
    ("enabled", "api", "rendered"),
    [(None, True, False), ("false", True, False), ("auto", False, False), ("auto", True, True), ("true", False, True)],
)
def test_the_rule_is_opt_in_like_the_monitors(enabled: str | None, api: bool, rendered: bool) -> None:
    docs = template({KEY: enabled} if enabled else {}, monitoring=api)
    assert (len([d for d in docs if d["kind"] == "PrometheusRule"]) == 1) is rendered


def test_alerts_on_slow_and_failing_pairs_with_the_values_thresholds() -> None:
    values = {KEY: "true", "metrics.prometheusRule.slowFor": "15m",
              "metrics.prometheusRule.labels.release": "kube-prometheus-stack"}  # fmt: skip
    rule = one(template(values), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "xpyd-system"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {"XpydKvHandoffSlow", "XpydKvHandoffFailures", "XpydNoPairableWorkers"}
    slow, failing = alerts["XpydKvHandoffSlow"], alerts["XpydKvHandoffFailures"]
    assert slow["for"] == "15m" and failing["for"] == "5m"
    assert f"{names.ROUTER_HANDOFF_LATENCY}_bucket" in slow["expr"]
    assert names.ROUTER_HANDOFF_FAILURES in failing["expr"]
    assert failing["expr"].rstrip().endswith("> 0.05")
    for alert in (slow, failing):
        assert "by (namespace, deployment, prefill, decode" in alert["expr"]  # one alert per pair
        assert "{{ $labels.prefill }}" in alert["annotations"]["summary"]  # Prometheus' template, left to it
    for alert in alerts.values():
        assert alert["labels"]["severity"] == "warning"
        assert not re.search(r"\{\{\s*\.Values", str(alert))


def _slow(values: dict[str, str]) -> dict[str, object]:
    rule = one(template({KEY: "true", **values}), "PrometheusRule")
    return next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "XpydKvHandoffSlow")


def test_a_slow_pair_is_one_over_its_deployments_break_even_by_default() -> None:
    alert = _slow({})
    expr = " ".join(str(alert["expr"]).split())
    p99, limit = expr.split(" > on (namespace, deployment) group_left () ")
    assert p99.startswith("histogram_quantile(0.99, sum by (namespace, deployment, prefill, decode, le)")
    # the gauge the routers export where the operator priced the break-even, else the fixed 2 s for the rest
    assert limit == (
        f"(max by (namespace, deployment) ({names.ROUTER_HANDOFF_BREAKEVEN} > 0) "
        f"or max by (namespace, deployment) ({names.ROUTER_HANDOFF_LATENCY}_count) * 0 + 2)"
    )
    assert "over the break-even" in str(alert["annotations"])


@pytest.mark.parametrize(
    ("values", "limit"),
    [({"metrics.prometheusRule.handoffThreshold": "fixed"}, "> 2"),
     ({"metrics.prometheusRule.handoffThreshold": "fixed", "metrics.prometheusRule.handoffP99Seconds": "5"}, "> 5"),
     ({"metrics.prometheusRule.handoffP99Seconds": "5"}, "* 0 + 5)")],
)  # fmt: skip
def test_the_values_keep_a_fixed_limit(values: dict[str, str], limit: str) -> None:
    alert = _slow(values)
    assert str(alert["expr"]).rstrip().endswith(limit)
    fixed = values.get("metrics.prometheusRule.handoffThreshold") == "fixed"
    assert (names.ROUTER_HANDOFF_BREAKEVEN in str(alert["expr"])) is not fixed


def test_the_threshold_is_breakeven_or_fixed() -> None:
    with pytest.raises(AssertionError, match="handoffThreshold"):
        template({KEY: "true", "metrics.prometheusRule.handoffThreshold": "p99"})


@pytest.mark.parametrize(
    ("values", "for_"),
    [({}, "5m"), ({"metrics.prometheusRule.unpairedFor": "90s"}, "90s")],
)
def test_alerts_on_no_pairable_pair_while_both_roles_have_workers(values: dict[str, str], for_: str) -> None:
    rule = one(template({KEY: "true", **values}), "PrometheusRule")
    alert = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "XpydNoPairableWorkers")
    assert alert["for"] == for_
    expr = " ".join(alert["expr"].split())
    # no router of the deployment can pair (max over its replicas)...
    assert expr.startswith(f"max by (namespace, deployment) ({names.ROUTER_PAIRABLE}) == 0 ")
    # ...while it knows workers of both roles (a deployment scaled to zero, or decode-only, stays quiet)
    for role in ("prefill", "decode"):
        known = f'sum by (namespace, deployment) ({names.ROUTER_WORKERS}{{role="{role}"}})'
        assert f"and on (namespace, deployment) ({known} > 0)" in expr
    assert alert["labels"]["severity"] == "warning"
    assert "{{ $labels.deployment }}" in alert["annotations"]["summary"]


def test_the_unpaired_duration_is_a_prometheus_duration() -> None:
    with pytest.raises(AssertionError, match="unpairedFor"):
        template({KEY: "true", "metrics.prometheusRule.unpairedFor": "five minutes"})
