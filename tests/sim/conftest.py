"""Shared fixtures of the simulator tests: a small spec file and a small Mooncake-format trace."""

from __future__ import annotations

from pathlib import Path

import pytest

SPEC = """\
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {name: sim-test}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  mode: Disaggregated
  topology: {kind: HGX-B200}
  prefill: {replicas: 2, gpusPerReplica: 1, autoscaling: {minReplicas: 1, maxReplicas: 4}}
  decode: {replicas: 2, gpusPerReplica: 1, autoscaling: {minReplicas: 1, maxReplicas: 4}}
  autoscaling: {enabled: true, intervalSeconds: 15}
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "dd.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def mooncake_file(tmp_path: Path) -> Path:
    """A small Mooncake-format trace with shared prefixes: 3 s buckets of 10 requests."""
    import json

    lines = []
    for i in range(120):
        shared = [0, 1, 2] if i % 2 else [100, 101]
        own = [1000 + 10 * i + k for k in range(3)]
        lines.append(
            json.dumps({"timestamp": (i // 10) * 3000, "input_length": 512 * (len(shared) + 3) - 100,
                        "output_length": 20 + i % 50, "hash_ids": shared + own})
        )  # fmt: skip
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
