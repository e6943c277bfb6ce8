"""The router's --kv-bytes-per-token: the model's KV bytes per token on the decode pool, as the operator sizes it."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]

from xpyd_operator import routerkit, sizing

IMG = "ghcr.io/xpyd/xpyd:test"
LLAMA_70B = 327680  # 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes


def _flag(**overrides: Any) -> str | None:
    cmd = routerkit.deployment(OWNER, spec(**overrides), IMG)["spec"]["template"]["spec"]["containers"][0]["command"]
    return cmd[cmd.index("--kv-bytes-per-token") + 1] if "--kv-bytes-per-token" in cmd else None


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ({}, LLAMA_70B),
        ({"model": {"name": "meta-llama/Llama-3.1-70B-Instruct", "kvBytesPerToken": 1000}}, 1000),
        ({"engine": {"args": ["--kv-cache-dtype", "fp8"]}}, LLAMA_70B // 2),  # an fp8 cache moves half
        ({"decode": {"replicas": 1, "gpusPerReplica": 8, "args": ["--kv-cache-dtype=fp8_e4m3"]}}, LLAMA_70B // 2),
        ({"model": {"name": "someone/unknown-model"}}, None),  # no shape known: no bytes series
    ],
)
def test_the_router_is_told_the_kv_bytes_a_handoff_moves(overrides: dict[str, Any], want: int | None) -> None:
    assert sizing.kv_bytes_per_token(spec(**overrides)) == want
    assert _flag(**overrides) == (str(want) if want is not None else None)


def test_no_flag_without_handoffs() -> None:
    colocated = spec(mode="Colocated", prefill=None, decode=None, worker={"replicas": 2, "gpusPerReplica": 8})
    assert sizing.kv_bytes_per_token(colocated) is None
