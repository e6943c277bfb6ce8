"""A deployment whose pools may stand at zero gets a router that holds requests while they start
(--hold-seconds) and keeps the model listed (--served-model); others keep the router's 503 at once."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]

from xpyd_operator import routerkit

IMG = "ghcr.io/xpyd/xpyd:test"
SCALED = {"gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}


def _command(**overrides: Any) -> list[str]:
    return list(
        routerkit.deployment(OWNER, spec(**overrides), IMG)["spec"]["template"]["spec"]["containers"][0]["command"]
    )


@pytest.mark.parametrize(
    ("overrides", "holds"),
    [
        ({}, False),
        ({"prefill": SCALED}, False),
        ({"prefill": {**SCALED, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}}, True),
        ({"decode": {"replicas": 0, "gpusPerReplica": 8}}, True),
    ],
)
def test_the_router_holds_requests_only_where_a_pool_may_be_at_zero(overrides: dict[str, Any], holds: bool) -> None:
    cmd = _command(**overrides)
    assert ("--hold-seconds" in cmd) == holds == routerkit.scales_to_zero(spec(**overrides))
    if holds:
        assert cmd[cmd.index("--hold-seconds") + 1] == "300"
        assert cmd[cmd.index("--served-model") + 1] == spec(**overrides).model.name


OFFLOADED = {"replicas": 2, "gpusPerReplica": 8, "kvOffload": {"cpuMemory": "256Gi"}}


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ({}, []),  # no CPU tier: the tiers scorer counts the GPU-held prefix only
        ({"prefill": OFFLOADED}, ["--cpu-tier-gpu", "B200", "--cpu-tier-model", "meta-llama/Llama-3.1-70B-Instruct",
                                  "--cpu-tier-tp", "8"]),
        ({"prefill": OFFLOADED, "model": {"name": "someone/unknown-model"}}, []),  # the router could not price it
    ],
)  # fmt: skip
def test_the_router_prices_reloads_from_a_first_hop_pools_cpu_tier(overrides: dict[str, Any], want: list[str]) -> None:
    cmd = _command(**overrides)
    got = cmd[cmd.index("--cpu-tier-gpu") : cmd.index("--cpu-tier-gpu") + 6] if "--cpu-tier-gpu" in cmd else []
    assert got == want
