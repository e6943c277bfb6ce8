"""--kv-transfer-config as the emulator reads it: a plain connector, or vLLM's MultiConnector chaining the handoff
connector and the OffloadingConnector (the CPU tier), as the operator renders a P/D pool with kvOffload."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_emulator.cmdline import CommandLineError, parse_engine_command, split_connectors

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
TIER = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 34}}  # fmt: skip


def multi(*chain: dict[str, Any], **outer: Any) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
            "kv_connector_extra_config": {"connectors": list(chain)}, **outer}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "handoff", "tier"),
    [
        (NIXL, NIXL, 0),  # a plain connector is the handoff, no tier
        (multi(NIXL, TIER), NIXL, 1 << 34),
        (multi(TIER, NIXL), NIXL, 1 << 34),  # the order of the chain does not matter to the emulator
        (multi(TIER), None, 1 << 34),  # only the tier: nothing to hand over
        (multi({"kv_connector": "NixlConnector"}, TIER), NIXL, 1 << 34),  # the outer kv_role where it sets none
        (
            multi({"kv_connector": "NixlConnector"}, TIER, kv_load_failure_policy="recompute"),
            {**NIXL, "kv_load_failure_policy": "recompute"},
            1 << 34,
        ),
    ],
)
def test_the_chain_gives_the_handoff_connector_and_the_tier(
    config: dict[str, Any], handoff: dict[str, Any] | None, tier: int
) -> None:
    assert split_connectors(config) == (handoff, tier)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kv_connector": "MultiConnector"}, "needs kv_connector_extra_config.connectors"),
        (multi(), "needs kv_connector_extra_config.connectors"),
        (multi("NixlConnector"), "needs kv_connector_extra_config.connectors"),  # type: ignore[arg-type]
        (multi({"kv_role": "kv_producer"}), r'connectors\[0\] needs a "kv_connector" string'),
        (multi(NIXL, {"kv_connector": "OffloadingConnector"}), "cpu_bytes_to_use, a positive byte count, got None"),
        (multi(NIXL, {**TIER, "kv_connector_extra_config": {"cpu_bytes_to_use": True}}), "got True"),
        (multi(NIXL, {**TIER, "kv_connector_extra_config": {"cpu_bytes_to_use": -1}}), "got -1"),
        (multi(NIXL, {"kv_connector": "LMCacheConnectorV1"}), "native offloading only"),
        (multi(NIXL, NIXL), "a second handoff connector"),
        (multi({**NIXL, "kv_role": "kv_sender"}, TIER), "kv_role 'kv_sender' is not one of"),
    ],
)
def test_a_chain_the_emulator_cannot_read_is_named(config: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        split_connectors(config)


def test_the_tier_given_twice_is_refused() -> None:
    command = [
        "vllm",
        "serve",
        "m",
        "--kv-offloading-size",
        "16",
        "--kv-transfer-config",
        json.dumps(multi(NIXL, TIER)),
    ]
    with pytest.raises(CommandLineError, match="the CPU tier is given twice"):
        parse_engine_command(command, {})


def test_a_chained_tier_sizes_the_emulators_cpu_tier() -> None:
    cfg = parse_engine_command(["vllm", "serve", "m", "--kv-transfer-config", json.dumps(multi(NIXL, TIER))], {})
    assert cfg.kv_offloading_bytes == 1 << 34
    assert cfg.kv_transfer_config == NIXL
