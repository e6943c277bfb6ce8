"""bench/dp's parts: both modes run on the same requests and the report holds a row and a ratio per pair."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.dp import report, run, suite

SMALL = suite.Deployment("HGX-B200 1P(DP16) 1D(DP16)", "HGX-B200", (1, 16), (1, 16))


def test_the_suite_runs_both_modes_and_routing_to_ranks_finds_the_history() -> None:
    chat = suite.Workload("chat-10rps", "chat", rate=10.0, duration_s=40.0)
    res = suite.run([SMALL], [chat], seeds=(0,), quick=True)
    (row,) = res["rows"]
    assert row["requests"] > 100
    assert set(row) >= {"ranks", "engine"}
    assert row["ranks"]["prefix_hit_ratio"] > row["engine"]["prefix_hit_ratio"]
    assert row["ranks"]["tokens_computed"] < row["engine"]["tokens_computed"]
    md = report.render(res, "# header")
    assert md.count("| HGX-B200 1P(DP16) 1D(DP16) | chat-10rps |") == 3  # one ratio row, one row per mode
    assert "x |" in md


def test_a_missing_trace_is_skipped_and_said(tmp_path: Path) -> None:
    absent = suite.Workload("mooncake-toolagent", "toolagent")
    if absent.available():  # a checkout with the trace: nothing to skip
        return
    res = suite.run([SMALL], [absent], seeds=(0,), quick=True)
    assert res["rows"] == []
    assert res["skipped"] == ["mooncake-toolagent"]
    assert "Skipped" in report.render(res, "# header")


def test_the_command_writes_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "dp.md"
    monkeypatch.setattr(suite, "DEPLOYMENTS", (SMALL,))
    monkeypatch.setattr(suite, "WORKLOADS", (suite.Workload("agent-5rps", "agent", rate=5.0, duration_s=20.0),))
    assert run.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Routing to data-parallel ranks")
    assert "bench/dp/run.py --quick" in text
    assert "agent-5rps" in text
