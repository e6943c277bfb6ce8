"""Scale to zero and back: a pool at zero starts one replica while the router holds requests for it,
whatever policy decided, and only then."""

from __future__ import annotations

import pytest

from xpyd_operator.autoscaling.promql import held_query
from xpyd_operator.autoscaling.spec import wake
from xpyd_operator.autoscaling.types import Decision, PolicyInputs, PoolBounds, PoolDecision, PoolObservation


def _decide(desired: dict[str, int], held: float | None, max_replicas: int = 4) -> dict[str, tuple[int, str]]:
    pools = {r: PoolObservation(replicas=n, held=held) for r, n in desired.items()}
    bounds = {r: PoolBounds(0, max_replicas, 8) for r in desired}
    decision = Decision({r: PoolDecision(n, "hold", "") for r, n in desired.items()}, True, "Ok", "", {})
    out = wake(PolicyInputs(pools, bounds), decision)
    return {r: (d.desired, d.reason) for r, d in out.pools.items()}


@pytest.mark.parametrize(
    ("desired", "held", "want"),
    [
        (
            {"prefill": 0, "decode": 0},
            3.0,
            {"prefill": (1, "wake"), "decode": (1, "wake")},
        ),  # both: a request needs both
        ({"prefill": 0, "decode": 2}, 1.0, {"prefill": (1, "wake"), "decode": (2, "hold")}),
        ({"prefill": 0, "decode": 0}, 0.0, {"prefill": (0, "hold"), "decode": (0, "hold")}),  # nothing waits: stay down
        ({"prefill": 0, "decode": 0}, None, {"prefill": (0, "hold"), "decode": (0, "hold")}),  # no router series
        ({"worker": 3}, 5.0, {"worker": (3, "hold")}),  # replicas left: the policy's answer stands
    ],
)
def test_held_requests_wake_pools_at_zero(
    desired: dict[str, int], held: float | None, want: dict[str, tuple[int, str]]
) -> None:
    assert _decide(desired, held) == want


def test_the_held_query_reads_the_deployments_routers() -> None:
    assert held_query("ns", 'd"x') == 'sum(xpyd_router_held_requests{namespace="ns",deployment="d\\"x"})'
