"""The router's --handoff-slow-seconds: the deployment's break-even (the decode stall disaggregation saves) unless
spec.router.handoffSlowSeconds says otherwise, so a pair whose handoffs cost more than that is taken out."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]

from xpyd_operator import routerkit, sizing, statuscalc
from xpyd_perf import break_even

IMG = "ghcr.io/xpyd/xpyd:test"
M70 = "meta-llama/Llama-3.1-70B-Instruct"
COLOCATED: dict[str, Any] = {"mode": "Colocated", "prefill": None, "decode": None,
                             "worker": {"replicas": 2, "gpusPerReplica": 8}}  # fmt: skip


def _flag(**overrides: Any) -> str | None:
    cmd = routerkit.deployment(OWNER, spec(**overrides), IMG)["spec"]["template"]["spec"]["containers"][0]["command"]
    return cmd[cmd.index("--handoff-slow-seconds") + 1] if "--handoff-slow-seconds" in cmd else None


def _ms_up(seconds: float) -> str:
    return f"{math.ceil(seconds * 1000) / 1000:g}"


@pytest.mark.parametrize(
    ("overrides", "model", "topology", "tokens", "tp"),
    [
        ({}, M70, "HGX-B200", 4096, 8),
        ({"workload": {"promptTokens": 32768}}, M70, "HGX-B200", 32768, 8),  # the representative prompt
        ({"prefill": {"replicas": 1, "gpusPerReplica": 4}, "decode": {"replicas": 1, "gpusPerReplica": 4}},
         M70, "HGX-B200", 4096, 4),  # the pools' tensor parallel
        ({"topology": {"kind": "GB200-NVL72"}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}},
         "meta-llama/Llama-3.1-8B-Instruct", "GB200-NVL72", 4096, 8),
    ],
)  # fmt: skip
def test_the_router_is_held_to_the_break_even(
    overrides: dict[str, Any], model: str, topology: str, tokens: int, tp: int
) -> None:
    stall = break_even(model, topology, tokens, tp).stall_seconds
    assert _flag(**overrides) == _ms_up(stall)
    # the very stall the DisaggregationWorthwhile condition quotes
    condition = statuscalc.worthwhile(spec(**overrides), 1)
    assert f"{stall * 1e3:.1f} ms decode stall" in condition.message


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ({"router": {"handoffSlowSeconds": 1.5}}, "1.5"),  # the user's, whatever the break-even
        ({"router": {"handoffSlowSeconds": 0}}, None),  # the trip off
        ({"topology": {"kind": "Any"}}, None),  # no hardware to price the stall by
        ({"model": {"name": "someone/unknown-model", "kvBytesPerToken": 1000}}, None),  # a model of unknown shape
        (COLOCATED, None),  # no handoff
        ({**COLOCATED, "router": {"handoffSlowSeconds": 2}}, "2"),  # asked for: passed on (no pair to trip)
    ],
)
def test_the_spec_says_otherwise_or_nothing_prices_it(overrides: dict[str, Any], want: str | None) -> None:
    assert _flag(**overrides) == want


def test_a_negative_limit_is_refused_by_the_api() -> None:
    with pytest.raises(ValueError, match="handoffSlowSeconds|handoff_slow_seconds"):
        spec(router={"handoffSlowSeconds": -1})


def test_the_break_even_is_the_prefill_pools() -> None:
    s = spec(decode={"replicas": 1, "gpusPerReplica": 4})
    verdict = sizing.break_even_of(s, s.pools()["prefill"])
    assert verdict is not None and routerkit.breakeven_seconds(s) == verdict.stall_seconds
