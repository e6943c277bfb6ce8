"""The pool builders' one context: the pool, placement and image a builder reads, in one frozen value."""

from __future__ import annotations

import dataclasses

import pytest
from fakekube import CLIQUE_A, CLIQUE_B, OWNER, spec  # type: ignore[import-not-found]

from xpyd_api import labels as L
from xpyd_operator import pools
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.placement import Placement

IMG = "ghcr.io/xpyd/xpyd:test"


def _placement(pins: dict[str, str | None]) -> Placement:
    return Placement({L.GPU_PRODUCT: "NVIDIA-GB200"}, pins, True, "Placed", "", "NVLink")


@pytest.mark.parametrize(
    ("role", "pins", "compute_domain", "clique", "imex"),
    [
        ("prefill", {"prefill": CLIQUE_A, "decode": CLIQUE_B}, True, CLIQUE_A, True),
        ("decode", {"prefill": CLIQUE_A, "decode": CLIQUE_B}, True, CLIQUE_B, True),
        ("decode", {"prefill": CLIQUE_A, "decode": None}, True, None, False),  # unpinned: no rack channel
        ("prefill", {"prefill": CLIQUE_A}, False, CLIQUE_A, False),  # no ComputeDomain
        ("decode", {}, False, None, False),
    ],
)
def test_placed_reads_the_role_s_pin_from_the_placement(
    role: str, pins: dict[str, str | None], compute_domain: bool, clique: str | None, imex: bool
) -> None:
    s = spec(topology={"kind": "GB200-NVL72"}, prefill={"gpusPerReplica": 4}, decode={"gpusPerReplica": 4})
    b = PoolBuild.placed(OWNER, s, role, _placement(pins), compute_domain, IMG)
    assert (b.clique, b.imex, b.pool, b.image) == (clique, imex, s.pools()[role], IMG)
    assert dict(b.node_selector) == {L.GPU_PRODUCT: "NVIDIA-GB200"}
    assert b.layout == s.pools()[role].layout(s.topology.hardware)
    claims = pools.pod_template(b)["spec"].get("resourceClaims")
    assert (claims is not None) is imex


def test_a_role_the_spec_has_no_pool_for_is_refused() -> None:
    s = spec()
    with pytest.raises(ValueError, match="no worker pool"):
        PoolBuild(OWNER, s, "worker", IMG)


def test_the_context_is_frozen() -> None:
    b = PoolBuild(OWNER, spec(), "decode", IMG)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.role = "prefill"  # type: ignore[misc]
