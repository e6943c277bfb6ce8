"""Table-driven tests of the cross-pool rules: the P:D ratio band and the rack's free GPUs."""

from __future__ import annotations

import pytest

from xpyd_api.models import RatioBand
from xpyd_operator.autoscaling.guards import apply_gpu_ceiling, apply_ratio_band
from xpyd_operator.autoscaling.policy import XpydPolicy
from xpyd_operator.autoscaling.types import PolicyInputs, PoolBounds, PoolDecision, PoolObservation

NOW = 5_000.0
BOUNDS = {"prefill": PoolBounds(1, 8, gpus_per_replica=4), "decode": PoolBounds(1, 16, gpus_per_replica=4)}


def dec(p: int, d: int) -> dict[str, PoolDecision]:
    return {"prefill": PoolDecision(p, "hold", ""), "decode": PoolDecision(d, "hold", "")}


@pytest.mark.parametrize(
    ("p", "d", "band", "blocked", "want", "reasons"),
    [
        (2, 4, None, (), (2, 4), ("hold", "hold")),
        (2, 4, (0.25, 1.0), (), (2, 4), ("hold", "hold")),  # 0.5 is inside
        (1, 8, (0.25, 1.0), (), (2, 8), ("ratio-band", "hold")),  # too few prefill: raise prefill
        (6, 4, (0.25, 1.0), (), (6, 6), ("hold", "ratio-band")),  # too many prefill: raise decode
        (8, 2, (0.25, 0.5), (), (8, 16), ("hold", "ratio-band")),
        (8, 1, (0.25, 0.25), (), (8, 16), ("hold", "ratio-band")),  # capped by decode's max
        (1, 8, (0.25, 1.0), ("prefill",), (1, 8), ("hold", "hold")),  # prefill pods Pending: no raise
        (3, 0, (0.25, 1.0), (), (3, 3), ("hold", "ratio-band")),
    ],
)
def test_ratio_band(
    p: int,
    d: int,
    band: tuple[float, float] | None,
    blocked: tuple[str, ...],
    want: tuple[int, int],
    reasons: tuple[str, str],
) -> None:
    out = apply_ratio_band(dec(p, d), BOUNDS, RatioBand(min=band[0], max=band[1]) if band else None, blocked)
    assert (out["prefill"].desired, out["decode"].desired) == want
    assert (out["prefill"].reason, out["decode"].reason) == reasons


@pytest.mark.parametrize(
    ("current", "desired", "free", "want"),
    [
        ((2, 4), (4, 8), None, (4, 8)),  # not on NVL72: no ceiling
        ((2, 4), (4, 8), 24, (4, 8)),  # 6 more replicas x 4 GPUs fit exactly
        ((2, 4), (4, 8), 8, (3, 5)),  # 2 replicas' worth: one each, least-served first
        ((2, 4), (4, 8), 3, (2, 4)),  # not even one replica fits
        ((2, 4), (4, 8), 0, (2, 4)),
        ((2, 4), (1, 8), 8, (1, 6)),  # shrinking prefill frees nothing yet; decode gets both
        ((2, 4), (4, 8), -4, (2, 4)),  # over-committed rack: no growth at all
    ],
)
def test_gpu_ceiling(
    current: tuple[int, int], desired: tuple[int, int], free: int | None, want: tuple[int, int]
) -> None:
    cur = {"prefill": current[0], "decode": current[1]}
    out = apply_gpu_ceiling(dec(*desired), cur, BOUNDS, free)
    assert (out["prefill"].desired, out["decode"].desired) == want
    grown = sum((out[r].desired - cur[r]) * 4 for r in cur if out[r].desired > cur[r])
    assert free is None or grown <= max(free, 0)


def test_policy_applies_band_then_ceiling() -> None:
    pools = {
        "prefill": PoolObservation(replicas=1, ready=1, waiting=0.0, sampled_at=NOW),
        "decode": PoolObservation(replicas=4, ready=4, waiting=12.0, kv_usage=0.9, sampled_at=NOW),
    }
    inputs = PolicyInputs(pools=pools, bounds=BOUNDS, ratio_band=RatioBand(min=0.5, max=2.0), free_gpus=16)
    d = XpydPolicy().decide(inputs, {}, NOW)
    # decode wants 12 (queue) -> at most 8 this step; band wants prefill 4; 16 GPUs = 4 replicas more.
    assert (d.pools["prefill"].desired, d.pools["decode"].desired) == (3, 6)
    assert {d.pools["prefill"].reason, d.pools["decode"].reason} == {"gpu-ceiling"}
    assert d.state["decode"].last_desired == 6
