"""`xpyd plan` takes the API's parallel layout, says how many nodes a replica spans and suggests the smallest fit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_perf.cli import main as plan

LINE_DS_NVL72 = "gpusPerReplica: 8, tensorParallelSize: 1, dataParallelSize: 8, expertParallel: true"


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str], rc: int = 0) -> dict[str, Any]:
    assert plan([*argv, "--json", "--prompt-tokens", "8192"]) == rc
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


# (flags, fits, layout the fit-check sees (GPUs, TP, DP, EP), pods per replica, smallest fit's GPUs)
CASES = [
    (["--model", "llama-3.1-70b", "--topology", "HGX-B200"], True, (8, 8, 1, False), 1, 2),  # no size: 8 GPUs
    (["--model", "llama-3.1-70b", "--topology", "GB200-NVL72"], True, (8, 8, 1, False), 2, 2),
    (["--model", "llama-3.1-70b", "--gpus-per-replica", "1"], False, (1, 1, 1, False), 1, 2),
    (["--model", "deepseek-v3", "--topology", "HGX-B200"], True, (8, 1, 8, True), 1, 8),  # MoE: wide EP by default
    (["--model", "deepseek-v3", "--topology", "GB200-NVL72", "--gpus-per-replica", "4"], False, (4, 4, 1, False), 1,
     8),  # one tray does not hold 671 GB
    (["--model", "deepseek-v3", "--topology", "GB200-NVL72", "--gpus-per-replica", "4", "--data-parallel-size", "4",
      "--expert-parallel"], False, (4, 1, 4, True), 1, 8),
    (["--model", "deepseek-r1", "--topology", "GB200-NVL72", "--gpus-per-replica", "8", "--data-parallel-size", "8",
      "--expert-parallel"], True, (8, 1, 8, True), 2, 8),
    (["--model", "deepseek-v3", "--topology", "HGX-B200", "--gpus-per-replica", "16", "--data-parallel-size", "16",
      "--expert-parallel"], True, (16, 1, 16, True), 2, 8),  # two nodes: one LeaderWorkerSet group
    (["--model", "deepseek-v3", "--topology", "H100"], True, (16, 1, 16, True), 2, 16),  # 8 x 80 GB is too small
    (["--model", "llama-3.1-70b", "--tensor-parallel-size", "2", "--data-parallel-size", "2"], True, (4, 2, 2, False),
     1, 2),
    (["--model", "deepseek-v3", "--data-parallel-size", "16", "--expert-parallel"], True, (16, 1, 16, True), 2, 8),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "fits", "layout", "pods", "smallest"), CASES)
def test_plan_layouts(
    argv: list[str],
    fits: bool,
    layout: tuple[int, int, int, bool],
    pods: int,
    smallest: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = run_json(argv, capsys, 0 if fits else 2)
    fit = doc["fit"]
    assert fit["fits"] is fits
    assert (fit["gpus"], fit["tp"], fit["dp"], fit["expert_parallel"]) == layout
    assert doc["layout"]["pods_per_replica"] == pods
    assert doc["smallest_fit"]["gpusPerReplica"] == smallest
    assert doc["smallest_fit"]["fits"] is True


def test_a_replica_that_does_not_fit_gets_the_smallest_that_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan(["--model", "deepseek-v3", "--topology", "GB200-NVL72", "--gpus-per-replica", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "does not fit" in captured.err
    assert f"smallest replica that fits on GB200-NVL72: {{{LINE_DS_NVL72}}}" in captured.err
    assert "a LeaderWorkerSet group of 2 pods" in captured.err


def test_without_a_size_plan_prints_the_line_to_paste(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan(["--model", "deepseek-r1", "--topology", "GB200-NVL72", "--prompt-tokens", "8192"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"  {LINE_DS_NVL72}" in lines
    assert "one replica: 2 GB200-NVL72 trays of 4 GPUs in one NVLink domain: a LeaderWorkerSet group of 2 pods" in lines


def test_a_multi_node_replica_is_priced_per_nvlink_domain(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "deepseek-v3", "--gpus-per-replica", "16", "--data-parallel-size", "16", "--expert-parallel"]
    doc = run_json(argv, capsys)
    assert doc["timing_gpus"] == 8 and doc["layout"]["span"].startswith("2 HGX-B200 nodes")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus-per-replica", "12"], "must be <= 8 or a multiple of 8 on HGX-B200"),
        (["--gpus-per-replica", "16", "--data-parallel-size", "1", "--topology", "GB200-NVL72"], None),
        (["--gpus-per-replica", "76", "--topology", "GB200-NVL72"], "must be <= 72 on GB200-NVL72"),
        (["--gpus-per-replica", "16", "--data-parallel-size", "3"], "engine's world size"),
        (["--gpus-per-replica", "8", "--tensor-parallel-size", "4"], "engine's world size"),
        (["--gpus-per-replica", "24", "--data-parallel-size", "4"], "a data-parallel rank never spans nodes"),
        (["--gpus-per-replica", "0"], "must be >= 1"),
        (["--expert-parallel"], "--expert-parallel needs a replica size"),
    ],
)
def test_layouts_the_api_refuses(argv: list[str], message: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    rc = plan(["--model", "llama-3.1-70b", "--prompt-tokens", "2048", *argv])
    err = capsys.readouterr().err
    assert (rc, message is None or message in err) == (0 if message is None else 2, True), err
