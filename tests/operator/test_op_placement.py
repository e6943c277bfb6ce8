"""Placement: free GPUs per clique, one-rack packing, stickiness, spill across racks, HGX rules."""

from __future__ import annotations

import pytest
from fakekube import CLIQUE_A, CLIQUE_B, b200_nodes, nvl72_nodes  # type: ignore[import-not-found]

from xpyd_api.models import TopologySpec
from xpyd_operator.placement import (
    Demand,
    PodInfo,
    Reservation,
    free_by_clique,
    place,
    unschedulable_reason,
)
from xpyd_perf import TOPOLOGIES, Topology

ME = "ns1/llama"
HGX, NVL72 = TOPOLOGIES["HGX-B200"], TOPOLOGIES["GB200-NVL72"]


def _hw(kind: str) -> Topology | None:
    return TopologySpec(kind=kind).hardware


def _d(prefill: int, decode: int, gpus: int = 4, tp_decode: int | None = None) -> list[Demand]:
    return [Demand("prefill", prefill, gpus, gpus), Demand("decode", decode, gpus, tp_decode or gpus)]


@pytest.mark.parametrize(
    ("pods", "reservations", "want"),
    [
        ([], [], {CLIQUE_A: 72, CLIQUE_B: 72}),
        ([PodInfo("gb200-r0-t0", 4)], [], {CLIQUE_A: 68, CLIQUE_B: 72}),  # a foreign GPU pod
        ([PodInfo("gb200-r0-t0", 4, ME)], [], {CLIQUE_A: 72, CLIQUE_B: 72}),  # our own pod is not counted
        ([], [Reservation("ns2/other", CLIQUE_B, 40)], {CLIQUE_A: 72, CLIQUE_B: 32}),  # before its pods bind
        ([], [Reservation(ME, CLIQUE_B, 40)], {CLIQUE_A: 72, CLIQUE_B: 72}),  # our own reservation
        (  # a bound pod of a reserving deployment is counted once, through the reservation
            [PodInfo("gb200-r1-t0", 4, "ns2/other", CLIQUE_B)],
            [Reservation("ns2/other", CLIQUE_B, 8)],
            {CLIQUE_A: 72, CLIQUE_B: 64},
        ),
        ([PodInfo("b200-0", 8)], [], {CLIQUE_A: 72, CLIQUE_B: 72}),  # pods off the racks do not count
    ],
)
def test_free_by_clique(pods: list[PodInfo], reservations: list[Reservation], want: dict[str, int]) -> None:
    nodes = nvl72_nodes() + b200_nodes(1)
    assert free_by_clique(nodes, pods, reservations, ME) == want


@pytest.mark.parametrize(
    ("free", "demands", "current", "pins", "satisfied", "kv"),
    [
        # whole unit fits: best fit (fewest free GPUs that still fit)
        ({CLIQUE_A: 72, CLIQUE_B: 40}, _d(2, 6), {}, {CLIQUE_B}, True, "NVLink"),
        ({CLIQUE_A: 72, CLIQUE_B: 20}, _d(2, 6), {}, {CLIQUE_A}, True, "NVLink"),
        # sticky: stays where it is while it still fits, even if another is a better fit
        (
            {CLIQUE_A: 72, CLIQUE_B: 40},
            _d(2, 6),
            {"prefill": CLIQUE_A, "decode": CLIQUE_A},
            {CLIQUE_A},
            True,
            "NVLink",
        ),
        # too big for one rack: spread, each pool pinned where it fits
        ({CLIQUE_A: 72, CLIQUE_B: 72}, _d(4, 16), {}, {CLIQUE_A, CLIQUE_B}, False, "RDMA"),
        # a pool bigger than any rack stays unpinned
        ({CLIQUE_A: 72, CLIQUE_B: 72}, _d(2, 20), {}, {CLIQUE_A, None}, False, "RDMA"),
    ],
)
def test_place_nvl72(
    free: dict[str, int],
    demands: list[Demand],
    current: dict[str, str | None],
    pins: set[str | None],
    satisfied: bool,
    kv: str,
) -> None:
    got = place(NVL72, demands, free, current)
    assert set(got.pins.values()) == pins
    assert (got.satisfied, got.kv_path) == (satisfied, kv)
    assert got.node_selector == NVL72.node_selector()
    assert got.reason == ("OneRack" if satisfied else "SpansRacks")


def test_spread_message_says_the_handoff_crosses_racks() -> None:
    got = place(NVL72, _d(4, 16), {CLIQUE_A: 72, CLIQUE_B: 72})
    assert "crosses racks" in got.message
    assert "decode (64 GPUs)" in got.message
    assert got.cliques == sorted([CLIQUE_A, CLIQUE_B])


@pytest.mark.parametrize(
    ("topology", "demands", "satisfied", "reason", "kv", "selector"),
    [
        ("HGX-B200", _d(2, 4, 8), True, "OneNodePerReplica", "RDMA", HGX.node_selector()),
        (
            "HGX-B200",
            _d(2, 4, 8, tp_decode=4),
            False,
            "TensorParallelMismatch",
            "RDMA",
            HGX.node_selector(),
        ),
        (
            "HGX-B200",
            [Demand("worker", 2, 8, 8)],
            True,
            "OneNodePerReplica",
            "Local",
            HGX.node_selector(),
        ),
        ("Any", _d(1, 1, 1), True, "NoTopology", "Unknown", {}),
    ],
)
def test_place_hgx_and_any(
    topology: str, demands: list[Demand], satisfied: bool, reason: str, kv: str, selector: dict[str, str]
) -> None:
    got = place(_hw(topology), demands)
    assert (got.satisfied, got.reason, got.kv_path, got.node_selector) == (satisfied, reason, kv, selector)
    assert set(got.pins.values()) == {None}


@pytest.mark.parametrize(
    ("topology", "gpus", "problem"),
    [
        ("HGX-B200", 8, None),
        ("GB200-NVL72", 4, None),
        (
            "GB200-NVL72",
            8,
            "prefill.gpusPerReplica=8 fits no node: the largest of 36 schedulable GB200-NVL72",
        ),
        ("Any", 9, "prefill.gpusPerReplica=9 fits no node: the largest of 40 schedulable nodes has 8"),
    ],
)
def test_unschedulable_reason(topology: str, gpus: int, problem: str | None) -> None:
    nodes = b200_nodes() + nvl72_nodes()
    got = unschedulable_reason(nodes, _hw(topology), _d(1, 1, gpus))
    assert got == problem if problem is None else (got or "").startswith(problem)
