"""The demo's own check: it fails unless each pool grew under load and shrank back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
from verify import verdict  # type: ignore[import-not-found]

GREW = "prefill: never grew above 1 ready replicas under load (peak 1)"
SHRANK = "prefill: still 2 ready replicas after the load stopped (want 1)"


@pytest.mark.parametrize(
    ("ready", "problems"),
    [
        ({"prefill": [1, 2, 3, 1], "decode": [1, 4, 1]}, []),
        (
            {"prefill": [1, 1, 1], "decode": [1, 4, 1]},
            [GREW],
        ),
        (
            {"prefill": [1, 3, 2], "decode": [1, 4, 1]},
            [SHRANK],
        ),
        ({"prefill": [1, 3, 1]}, ["decode: no ready-replica samples in Prometheus"]),
    ],
)
def test_verdict(ready: dict[str, list[float]], problems: list[str]) -> None:
    assert verdict(ready, {"prefill": 1, "decode": 1}) == problems
