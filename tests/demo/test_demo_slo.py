"""The demo's deployment states an SLO, so the autoscaler runs its SLO policy there; under loads shaped like
the demo's two phases that policy grows the pool each phase presses, and both go back to one replica idle
(what demo/verify.py asks of the live run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import DisaggregatedDeployment, DisaggregatedDeploymentStatus
from xpyd_operator.autoscaling.slo import SloPolicy
from xpyd_operator.autoscaling.slomodel import replica_perfs
from xpyd_operator.autoscaling.spec import PoolRuntime, evaluate, policy_for
from xpyd_operator.autoscaling.types import PoolMetrics

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo" / "hgx-b200-emulated.yaml"
NOW = 10_000.0
SPEC = DisaggregatedDeployment.model_validate(yaml.safe_load(DEMO.read_text())).spec


def _decide(prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, int]:
    runtimes = {role: PoolRuntime(1, 1, 0) for role in ("prefill", "decode")}
    seen: dict[str, Any] = {"sampled_at": NOW - 2, "reporting": 1}
    metrics = {"prefill": PoolMetrics(**seen, **prefill), "decode": PoolMetrics(**seen, **decode)}
    return evaluate(SPEC, DisaggregatedDeploymentStatus(), 1, runtimes, metrics, NOW).desired


def test_the_demo_runs_the_slo_policy_on_both_pools() -> None:
    assert SPEC.slo is not None and SPEC.autoscaling.enabled
    assert isinstance(policy_for(SPEC), SloPolicy)
    perfs = replica_perfs(SPEC)  # both pools priced by the performance model: none falls back to thresholds
    assert set(perfs) == {"prefill", "decode"}
    assert perfs["decode"].max_seqs == 16  # decode's --max-num-seqs: past it answers queue


IDLE: dict[str, Any] = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0, "prompt_tokens_rate": 0.0, "request_rate": 0.0}


@pytest.mark.parametrize(
    ("phase", "prefill", "decode", "want"),
    [
        (  # phase 1: the Mooncake trace in real time (its first minute: 162 prompts, 37k prompt tokens/s)
            "long prompts",
            {**IDLE, "waiting": 20.0, "running": 4.0, "ttft_p90": 10.0, "prompt_tokens_rate": 37_000.0,
             "request_rate": 2.7, "prefix_hit_ratio": 0.05},
            {**IDLE, "running": 4.0, "kv_usage": 0.02, "itl_p90": 0.01, "request_rate": 2.7},
            {"prefill": 3, "decode": 1},
        ),
        (  # phase 2: 8 requests/s of 256-token prompts and 512-token answers; decode's batch is 16
            "long answers",
            {**IDLE, "running": 1.0, "kv_usage": 0.01, "ttft_p90": 0.1, "prompt_tokens_rate": 2048.0,
             "request_rate": 8.0, "prefix_hit_ratio": 0.0},
            {**IDLE, "waiting": 30.0, "running": 16.0, "kv_usage": 0.05, "itl_p90": 0.01, "request_rate": 8.0},
            {"prefill": 1, "decode": 4},
        ),
        ("idle", IDLE, IDLE, {"prefill": 1, "decode": 1}),
    ],
)  # fmt: skip
def test_each_phase_grows_the_pool_it_presses(
    phase: str, prefill: dict[str, Any], decode: dict[str, Any], want: dict[str, int]
) -> None:
    assert _decide(prefill, decode) == want, phase
