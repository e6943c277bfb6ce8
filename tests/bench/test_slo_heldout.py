"""The held-out shapes of bench/autoscaler/slo_heldout.py are what its docstring says they are."""

from __future__ import annotations

import pytest
from bench.autoscaler.slo_frontier import settings
from bench.autoscaler.slo_heldout import LABELS, LOAD_NAMES, SHARED_BASE, loads

DURATION = 1200.0
LOADS = {load.name: load.requests for load in loads(DURATION)}


def rate(name: str, start: float, end: float) -> float:
    return sum(start <= r.arrival < end for r in LOADS[name]) / (end - start)


def test_every_load_is_named_and_every_label_is_a_frontier_setting() -> None:
    assert tuple(LOADS) == LOAD_NAMES
    assert set(LABELS) <= {s.label for s in settings(quick=False)}


@pytest.mark.parametrize(
    ("name", "start", "end", "low", "high"),
    [
        ("sawtooth", 0.0, 60.0, 3.0, 11.0),  # the tooth's first fifth: 3 to 8.4 req/s
        ("sawtooth", 240.0, 300.0, 21.0, 32.0),  # its last: 24.6 to 30
        ("step", 0.0, 600.0, 3.5, 4.5),
        ("step", 600.0, 1200.0, 22.5, 25.5),
        ("decode-ramp", 0.0, 120.0, 1.5, 3.5),
    ],
)
def test_arrival_rates_follow_the_shape(name: str, start: float, end: float, low: float, high: float) -> None:
    assert low <= rate(name, start, end) <= high


def test_one_prompt_in_ten_is_a_document() -> None:
    prompts = [r.prompt_tokens for r in LOADS["bimodal"]]
    long = [p for p in prompts if p >= 24_000]
    assert 0.08 <= len(long) / len(prompts) <= 0.12
    assert all(p <= 40_000 for p in long) and all(200 <= p <= 900 for p in prompts if p < 24_000)


def test_tenants_share_their_system_prompts_blocks_and_nothing_else() -> None:
    firsts = {r.blocks[0] for r in LOADS["shared-prefix"]}
    assert len(firsts) == 4 and min(firsts) >= SHARED_BASE
    own = [b for r in LOADS["shared-prefix"] for b in r.blocks if b < SHARED_BASE]
    assert len(own) == len(set(own))  # past the system prompt every block is the request's own
