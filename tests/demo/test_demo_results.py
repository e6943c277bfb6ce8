"""The demo's SLO results: the clients' attainment per phase against the SLO the demo's manifest states."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "demo"))
from results import main, render, stated_slo, summary  # type: ignore[import-not-found]  # noqa: E402

MANIFEST = ROOT / "examples" / "demo" / "hgx-b200-emulated.yaml"
LINE = "requests=400  ok=398  errors=2  ttft_p50_s=0.21  ttft_p99_s=9.1  slo_attainment=0.71  tokens=6000  wall_s=61.2"


def test_the_slo_is_the_one_the_demo_deployment_states() -> None:
    assert stated_slo(MANIFEST) == (1.0, 0.05, 0.99, 95)


def test_the_summary_is_the_last_line_of_key_value_pairs(tmp_path: Path) -> None:
    out = tmp_path / "phase.txt"
    out.write_text("load ━━━━ 400/400 ttft 120 ms, errors 2\nrequests=1  ok=1\n" + LINE + "\n\n")
    got = summary(out)
    assert got["slo_attainment"] == "0.71" and got["requests"] == "400" and got["ttft_p99_s"] == "9.1"


@pytest.mark.parametrize(
    ("attainment", "meets"),
    [("0.99", "| 99.0% | yes |"), ("0.9899", "| 99.0% | no |"), ("1.0", "| 100.0% | yes |"), ("None", "| - | no |")],
)
def test_a_phase_meets_the_goal_only_at_or_above_it(attainment: str, meets: str) -> None:
    table = render([("phase", {"requests": "10", "slo_attainment": attainment})], 1.0, 0.05, 0.99, 95)
    assert table.rstrip().endswith(meets), table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "x.md", "phase=missing.txt"], "missing.txt"),
        (["--out", "x.md"], "--out and at least one NAME=FILE are needed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--manifest", str(MANIFEST), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_manifest_without_an_slo_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "dd.yaml"
    plain.write_text("apiVersion: xpyd.io/v1alpha1\nkind: DisaggregatedDeployment\nspec: {model: {name: m}}\n")
    assert main(["--manifest", str(plain), "--print-slo"]) == 2
    assert "no DisaggregatedDeployment states spec.slo" in capsys.readouterr().err
