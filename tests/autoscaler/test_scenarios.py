"""The policies over time on a virtual clock: spikes, noise, gaps in data, Pending pods, restarts."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable

import pytest

from xpyd_operator.autoscaling.policy import AUTOSCALERS, StaticPolicy, XpydPolicy, make_policy
from xpyd_operator.autoscaling.types import (
    PolicyInputs,
    PoolBounds,
    PoolObservation,
    PoolState,
    state_from_dict,
    state_to_dict,
)

TICK = 15.0
WINDOW = 300.0
BOUNDS = {"prefill": PoolBounds(1, 10)}


def toy_prefill(demand: float, n: int, backlog: float, now: float, fits: int) -> PoolObservation:
    """A pool asked for ``demand`` replicas' worth of work, with ``backlog`` requests queued."""
    ready = min(n, fits)
    return PoolObservation(
        replicas=n,
        ready=ready,
        unschedulable=max(0, n - fits),
        waiting=backlog,
        running=min(demand, ready) * 4.0,
        prompt_tokens_rate=min(demand, ready) * 1000.0,  # 1000 tok/s per replica, to be learned
        sampled_at=now - 3,
    )


def run(
    demand: Callable[[float], float],
    minutes: float,
    *,
    start: int = 2,
    fits: int = 99,
    missing: Callable[[float], bool] = lambda t: False,
    restart_every_tick: bool = True,
    policy: str = "xpyd",
) -> list[tuple[float, int]]:
    """Sizes over time; the history goes through JSON each tick as it does through the CR status."""
    pol = make_policy(policy)
    state: dict[str, PoolState] = {}
    n, sizes, backlog = start, [], 0.0
    t = 0.0
    while t < minutes * 60:
        backlog = max(0.0, backlog + (demand(t) - min(n, fits)) * 4.0)  # the excess queues up
        o = toy_prefill(demand(t), n, backlog, t, fits)
        if missing(t):
            o = PoolObservation(replicas=n, ready=o.ready, unschedulable=o.unschedulable)
        d = pol.decide(PolicyInputs(pools={"prefill": o}, bounds=BOUNDS), state, t)
        state = dict(d.state)
        if restart_every_tick:
            state = state_from_dict(json.loads(json.dumps(state_to_dict(state))))
        n = d.pools["prefill"].desired
        sizes.append((t, n))
        t += TICK
    return sizes


def spike(t: float) -> float:
    return 6.0 if 600 <= t < 1200 else 1.0


def turns(sizes: list[tuple[float, int]]) -> list[float]:
    """Times at which the size changed direction."""
    out, last = [], 0
    for (_, a), (t, b) in itertools.pairwise(sizes):
        if b != a:
            direction = 1 if b > a else -1
            if last and direction != last:
                out.append(t)
            last = direction
    return out


def test_spike_grows_fast_and_shrinks_calmly() -> None:
    sizes = dict(run(spike, 50))
    assert sizes[600 + 2 * TICK] >= 6  # two decisions into the spike
    during = [n for t, n in sizes.items() if 600 + 3 * TICK <= t < 1200]
    assert min(during) >= 6  # never shrinks under load
    assert sizes[1200 + WINDOW - 2 * TICK] >= 6  # holds through the stabilization window
    assert sizes[max(sizes)] == 2  # and back long after: 1 replica of work at 70 % utilization
    assert max(sizes.values()) <= BOUNDS["prefill"].max_replicas


def test_history_survives_restarts() -> None:
    assert run(spike, 50, restart_every_tick=True) == run(spike, 50, restart_every_tick=False)


def test_noise_causes_at_most_one_turn_per_window() -> None:
    rng = random.Random(7)

    def noisy(t: float) -> float:
        return max(0.0, 3.0 + 2.0 * math.sin(t / 90.0) + rng.uniform(-1.5, 1.5))

    sizes = run(noisy, 120)
    changes = turns(sizes)
    assert len(changes) >= 2  # the load does move the pool both ways
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    assert all(g >= WINDOW for g in gaps), gaps


def test_missing_data_never_shrinks() -> None:
    gap = (1300.0, 1700.0)
    sizes = run(spike, 50, missing=lambda t: gap[0] <= t < gap[1])
    in_gap = [n for t, n in sizes if gap[0] <= t < gap[1] + TICK]
    assert len(set(in_gap)) == 1  # held through the gap
    after = [n for t, n in sizes if gap[1] <= t < gap[1] + WINDOW - TICK]
    assert min(after) == in_gap[0]  # and a full window of fresh data is needed before shrinking


def test_pending_pods_stop_growth() -> None:
    sizes = run(lambda t: 9.0, 10, fits=4)
    assert max(n for _, n in sizes) == 6  # one step past what fits, then no further


def test_static_holds_and_registry_names() -> None:
    o = PoolObservation(replicas=7, waiting=100.0, sampled_at=0.0)
    d = StaticPolicy().decide(PolicyInputs(pools={"prefill": o}, bounds=BOUNDS), {}, 0.0)
    assert d.pools["prefill"].desired == 7
    assert {"xpyd", "off"} <= set(AUTOSCALERS)
    assert "keda" not in AUTOSCALERS  # a benchmark baseline (bench/baselines), not a product policy
    assert isinstance(make_policy("xpyd"), XpydPolicy)
    with pytest.raises(ValueError, match="unknown autoscaler 'hpa'; known: off, slo, xpyd"):
        make_policy("hpa")
