"""`xpyd simulate` honours every field of spec.autoscaling: each one, set, changes the simulated decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import AutoscalingSpec
from xpyd_operator.autoscaling.types import PoolObservation
from xpyd_sim import spec as specs
from xpyd_sim import trace
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.metrics import Histogram, Slo
from xpyd_sim.scaling import scaler_spec

NOW = 600.0


def _write(tmp_path: Path, spec_file: Path, **autoscaling: Any) -> Path:
    doc = yaml.safe_load(spec_file.read_text())
    doc["spec"]["autoscaling"].update(autoscaling)
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _spec(tmp_path: Path, spec_file: Path, **autoscaling: Any) -> specs.SimSpec:
    return specs.load(_write(tmp_path, spec_file, **autoscaling))


def _obs(replicas: int, waiting: float, kv_usage: float | None = None) -> PoolObservation:
    return PoolObservation(
        replicas=replicas, ready=replicas, reporting=replicas, sampled_at=NOW, waiting=waiting, kv_usage=kv_usage
    )


QUIET = {"prefill": _obs(2, waiting=0.0), "decode": _obs(2, waiting=0.0, kv_usage=0.5)}
QUEUED = {"prefill": _obs(2, waiting=8.0), "decode": _obs(2, waiting=0.0, kv_usage=0.5)}


def _decide(spec: specs.SimSpec, seen: dict[str, PoolObservation], ticks: int = 2) -> dict[str, tuple[int, str]]:
    """The simulated autoscaler's decision after `ticks` periods that all saw `seen`."""
    scaler = Simulation(spec, [], SimConfig(autoscaler="xpyd")).scaler
    scaler.observe = lambda now, itl: seen  # type: ignore[method-assign]
    out: dict[str, tuple[int, str]] = {}
    for i in range(ticks):
        out = scaler.decide(NOW + 15 * i, {})
    return out


# field -> (value, load the pools see, the pool to watch)
DECISION_CASES: dict[str, tuple[Any, dict[str, PoolObservation], str]] = {
    "targets": ({"prefillWaitingPerReplica": 8}, QUEUED, "prefill"),  # 8 queued: 4 replicas' worth at 2, 1 at 8
    "ratioBand": ({"min": 2, "max": 4}, QUIET, "prefill"),  # P:D 2:2 is below 2: prefill raised
    "stabilizationSeconds": (0, QUIET, "prefill"),  # no window to wait for: idle pools shrink at once
}
# Fields that act outside one decision, and where the simulator honours them.
ELSEWHERE = {
    "enabled": "the default of --autoscaler (test_enabled_chooses_the_default_autoscaler)",
    "intervalSeconds": "the period of the simulated autoscaler (test_interval_sets_the_period)",
    "staleAfterSeconds": "the simulated scrape is taken at decision time, so samples are never stale",
    "prometheusUrl": "the simulated pools are observed directly, not through Prometheus",
}


def test_every_autoscaling_field_is_covered() -> None:
    fields = {f.alias or name for name, f in AutoscalingSpec.model_fields.items()}
    assert fields == set(DECISION_CASES) | set(ELSEWHERE)


@pytest.mark.parametrize("field", sorted(DECISION_CASES))
def test_a_spec_field_changes_the_simulated_decision(tmp_path: Path, spec_file: Path, field: str) -> None:
    value, seen, pool = DECISION_CASES[field]
    before = _decide(specs.load(spec_file), seen)[pool]
    after = _decide(_spec(tmp_path, spec_file, **{field: value}), seen)[pool]
    assert after != before, f"{field}={value!r} left the decision at {before}"


def test_targets_given_in_the_spec_beat_the_slo_and_the_cli_beats_both(spec_file: Path, tmp_path: Path) -> None:
    spec = _spec(tmp_path, spec_file, targets={"ttftP90Seconds": 1.5, "decodeKvUsage": 0.5}).deployment
    merged = scaler_spec(spec, Slo(ttft_s=3.0, itl_s=0.2), {"decodeKvUsage": 0.6}).autoscaling.targets
    assert (merged.ttft_p90_seconds, merged.itl_p90_seconds, merged.decode_kv_usage) == (1.5, 0.2, 0.6)


@pytest.mark.parametrize(("enabled", "scaler"), [(True, "xpyd"), (False, "off")])
def test_enabled_chooses_the_default_autoscaler(
    tmp_path: Path, spec_file: Path, capsys: pytest.CaptureFixture[str], enabled: bool, scaler: str
) -> None:
    import json

    from xpyd_sim.cli import main

    path = _write(tmp_path, spec_file, enabled=enabled)
    assert main(["--spec", str(path), "--trace", "synthetic:rate=1,duration=20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["autoscaler"] == scaler


@pytest.mark.parametrize("interval", [5, 30])
def test_interval_sets_the_period(tmp_path: Path, spec_file: Path, interval: int) -> None:
    load = trace.synthetic(trace.Synthetic(rate=1.0, duration=100.0, prompt_mean=512, output_mean=32, seed=1))
    sim = Simulation(_spec(tmp_path, spec_file, intervalSeconds=interval), load, SimConfig(autoscaler="xpyd"))
    ticks: list[float] = []
    decide = sim.scaler.decide

    def counted(now: float, itl: dict[str, Histogram]) -> dict[str, tuple[int, str]]:
        ticks.append(now)
        return decide(now, itl)

    sim.scaler.decide = counted  # type: ignore[method-assign]
    sim.run()
    assert ticks[:3] == [interval, 2.0 * interval, 3.0 * interval]
