"""The autoscaler's series for the SLO row of the dashboard: the stated SLO, its removal, and wakes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from xpyd_api.models import SloSpec
from xpyd_operator.autoscaling.metrics import REASONS, AutoscalerMetrics
from xpyd_operator.autoscaling.spec import wake
from xpyd_operator.autoscaling.types import Decision, PolicyInputs, PoolBounds, PoolDecision, PoolObservation

DEP = {"namespace": "ns", "deployment": "dep"}
SLO = SloSpec(ttft_seconds=1.0, itl_seconds=0.05, percentile=99, attainment=0.95)


def _decision(reason: str = "hold", desired: int = 1) -> Decision:
    return Decision({r: PoolDecision(desired, reason, "") for r in ("prefill", "decode")}, True, "Ok", "", {})


def _record(m: AutoscalerMetrics, decision: Decision, slo: SloSpec | None, current: int = 1) -> None:
    sizes = {"prefill": current, "decode": current}
    m.record("ns", "dep", decision, sizes, sizes, slo)


@pytest.mark.parametrize(
    ("name", "labels", "want"),
    [
        ("xpyd_autoscaler_slo_target_seconds", {"latency": "ttft"}, 1.0),
        ("xpyd_autoscaler_slo_target_seconds", {"latency": "itl"}, 0.05),
        ("xpyd_autoscaler_slo_percentile", {}, 99.0),
        ("xpyd_autoscaler_slo_attainment_goal", {}, 0.95),
    ],
)
def test_the_stated_slo_is_exported_and_goes_with_it(name: str, labels: dict[str, str], want: float) -> None:
    registry = CollectorRegistry()
    m = AutoscalerMetrics(registry)
    _record(m, _decision(), SLO)
    assert registry.get_sample_value(name, {**DEP, **labels}) == want
    _record(m, _decision(), None)  # spec.slo removed: the threshold policy runs, no SLO series is left
    assert registry.get_sample_value(name, {**DEP, **labels}) is None
    _record(m, _decision(), None)  # and removing what is gone is no error


def test_no_slo_no_series() -> None:
    registry = CollectorRegistry()
    _record(AutoscalerMetrics(registry), _decision(), None)
    assert registry.get_sample_value("xpyd_autoscaler_slo_percentile", DEP) is None


def test_a_wake_is_counted_once_per_start_and_is_a_known_reason() -> None:
    assert "wake" in REASONS
    registry = CollectorRegistry()
    m = AutoscalerMetrics(registry)
    pools = {r: PoolObservation(replicas=0, held=2.0) for r in ("prefill", "decode")}
    woken = wake(PolicyInputs(pools, {r: PoolBounds(0, 2) for r in pools}), _decision(desired=0))
    _record(m, woken, None, current=0)  # both pools at zero, requests held: each starts one replica
    _record(m, woken, None, current=1)  # the next period, starting: not another wake
    labels = {**DEP, "role": "decode"}
    assert registry.get_sample_value("xpyd_autoscaler_wakes_total", labels) == 1
    assert registry.get_sample_value("xpyd_autoscaler_decision_reason", {**labels, "reason": "wake"}) == 1
    _record(m, _decision("hold", 0), None, current=0)  # nothing held: no wake
    assert registry.get_sample_value("xpyd_autoscaler_wakes_total", labels) == 1
