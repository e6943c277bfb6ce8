"""`xpyd simulate` end to end through its main(): JSON keys, comparisons, plots and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpyd_sim import spec as specs
from xpyd_sim.cli import main

REQUIRED = {
    "requests", "slo_attainment", "gpu_hours", "ttft_p50_s", "ttft_p99_s", "itl_p99_s", "prefix_hit_ratio",
    "imbalance", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    "kv_bytes_nvlink", "kv_bytes_nic", "replicas", "events_per_s",
}  # fmt: skip


def test_json_has_the_promised_keys(spec_file: Path, mooncake_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--spec", str(spec_file), "--trace", str(mooncake_file), "--router", "least-loaded", "--autoscaler", "on"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= REQUIRED
    assert out["requests"] == 120
    assert out["router"] == "least-loaded"
    assert out["autoscaler"] == "xpyd"
    assert 0 <= out["slo_attainment"] <= 1
    assert out["gpu_hours"] > 0


def test_compare_routers_prints_a_table_and_plots(
    spec_file: Path, mooncake_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--spec", str(spec_file), "--trace", str(mooncake_file), "--compare", "routers", "--plot", str(tmp_path)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for name in ("kv-aware", "round-robin", "least-loaded"):
        assert f"router={name}" in table
    assert "router=llm-d" not in table  # the peers' rules are benchmark baselines (bench/baselines)
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "compare.png" in pngs
    assert len(pngs) == 4
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_all_as_json(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--spec", str(spec_file), "--trace", "synthetic:rate=4,duration=30", "--compare", "all", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    labels = [r["label"] for r in rows]
    assert "colocated" in labels
    assert labels[-3:] == ["autoscaler=off", "autoscaler=slo", "autoscaler=xpyd"]
    assert len(rows) == 8
    assert {r["mode"] for r in rows} == {"Disaggregated", "Colocated"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trace", "nope.jsonl"], "does not exist"),
        (["--trace", "synthetic:rate=x"], "not key=number"),
        (["--trace", "synthetic:speed=3"], "unknown synthetic options"),
        (["--trace", "synthetic:rate=1", "--workers", "3"], "no such pool"),
        (["--trace", "synthetic:rate=1", "--topology", "TPU"], "valid topologies"),
        (["--trace", "synthetic:rate=1", "--hardware", "MI300"], "valid GPUs"),
        (["--trace", "synthetic:rate=1", "--router-replicas", "0"], "router replicas must be >= 1"),
        (["--trace", "synthetic:rate=1", "--scale", "0"], "--scale must be >= 1"),
        (["--trace", "synthetic:rate=1", "--autoscaler-target", "x"], "KEY=NUMBER"),
        (
            ["--trace", "synthetic:rate=1,duration=60", "--autoscaler-target", "speed=3"],
            "unknown spec.autoscaling.targets",
        ),
    ],
)
def test_bad_input_is_a_clear_error(
    spec_file: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--spec", str(spec_file), *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Deployment\napiVersion: apps/v1\n", "no DisaggregatedDeployment"),
        ("apiVersion: xpyd.io/v2\nkind: DisaggregatedDeployment\nspec: {}\n", "apiVersion xpyd.io/v1alpha1"),
        (
            "apiVersion: xpyd.io/v1alpha1\nkind: DisaggregatedDeployment\nspec: {model: {name: x}, mode: Colocated,"
            " worker: {replicas: 1}}\n",
            "unknown model",
        ),
        ("apiVersion: xpyd.io/v1alpha1\nkind: DisaggregatedDeployment\nspec: {modle: 1}\n", "invalid"),
        (": : :\n", "not valid YAML"),
    ],
)
def test_bad_specs(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(specs.SpecError, match=message):
        specs.load(path)


def test_spec_resolution(spec_file: Path) -> None:
    spec = specs.load(spec_file, topology="GB200-NVL72", gpu="B200")
    assert spec.topology.name == "GB200-NVL72"
    assert spec.topology.gpu.name == "B200"
    assert spec.label == "2P2D"
    assert spec.gpus == 4
    assert spec.deployment.autoscaling.enabled
    wider = spec.with_pools(prefill=6).deployment.prefill
    assert wider is not None and wider.autoscaling is not None
    assert (wider.replicas, wider.autoscaling.max_replicas) == (6, 6)


def test_plot_without_matplotlib_is_one_clear_error(
    spec_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the [plot] extra were not installed
    plots = tmp_path / "plots"
    argv = ["--spec", str(spec_file), "--trace", "synthetic:rate=1,duration=10", "--plot", str(plots)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xpyd simulate: --plot: plots need matplotlib: pip install 'xpyd[plot]'"]
    assert not plots.exists()  # refused before simulating, nothing written
