"""`xpyd plan`, `xpyd simulate` and `xpyd render` give one verdict, in one line, for a replica that does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpyd_cli.main import main
from xpyd_perf import GPUS, MODELS, replica_fit

DEEPSEEK = """
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {name: ds}
spec:
  model: {name: deepseek-ai/DeepSeek-V3}
  topology: {kind: GB200-NVL72}
  prefill: {replicas: 1, gpusPerReplica: 4}
  decode: {replicas: 1, gpusPerReplica: 8, dataParallelSize: 8, expertParallel: true}
"""
SUMMARY = replica_fit(MODELS["deepseek-v3"], GPUS["GB200"], 4).summary()  # one 4-GPU tray: 179.3 > 167.4 GB
OPERATOR = f"the operator would refuse it (Ready=False, ReplicaDoesNotFit): prefill: {SUMMARY}"
FIX = "smallest replica that fits on GB200-NVL72: {gpusPerReplica: 8, tensorParallelSize: 1, dataParallelSize: 8"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["plan", "--model", "deepseek-v3", "--topology", "GB200-NVL72", "--gpus-per-replica", "4"],
         [f"xpyd plan: error: {SUMMARY}", FIX]),
        (["simulate", "--spec", "{dd}", "--trace", "synthetic:rate=1,duration=5"], [f"xpyd simulate: ds: {OPERATOR}"]),
        (["render", "{dd}"], [OPERATOR]),
    ],
)  # fmt: skip
def test_one_verdict_in_one_line(
    argv: list[str], want: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dd.yaml").write_text(DEEPSEEK)
    assert main([a.replace("{dd}", str(tmp_path / "dd.yaml")) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1, captured.err
    for part in want:
        assert part in captured.err
