"""A decode refuses KV from a prefill it cannot read, with the failed-KV-load answer vLLM gives (HTTP 500).

The prefill's side channel carries its handshake (handoff facts and, when the operator set XPYD_ENGINE_REV,
its engine revision), as NIXL's handshake carries vLLM's compatibility hash; the decode checks it before it
decodes. With kv_load_failure_policy=recompute the decode recomputes the prompt instead, as vLLM does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from emu_harness import KV_CONFIG, make_config, running  # type: ignore[import-not-found]

from xpyd_api import labels as L
from xpyd_emulator.cmdline import parse_engine_command
from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.worker import Worker, handoff_facts

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RECOMPUTE = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute"}'


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _handoff(http: aiohttp.ClientSession, prefill: str, decode: str) -> tuple[int, Any]:
    request = {"model": MODEL, "prompt": "shared context " * 100, "max_tokens": 4}
    hop1 = dict(request, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    async with http.post(prefill + "/v1/completions", data=orjson.dumps(hop1)) as resp:
        assert resp.status == 200
        kv = orjson.loads(await resp.read())["kv_transfer_params"]
    async with http.post(decode + "/v1/completions", data=orjson.dumps(dict(request, kv_transfer_params=kv))) as resp:
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize(
    ("prefill_args", "decode_args", "prefill_rev", "decode_rev", "refusal"),
    [
        ((), (), None, None, None),
        ((), (), "aaaa", "aaaa", None),
        ((), (), "aaaa", None, None),  # a decode told no revision checks facts only
        ((), (), "aaaa", "bbbb", "engine revision aaaa"),
        (("--kv-cache-dtype", "fp8"), (), None, None, "NIXL compatibility hash mismatch"),
        (("--block-size", "64"), ("--block-size", "16"), None, None, "Local block size 16 is not divisible"),
        (("--block-size", "16"), ("--block-size", "64"), None, None, None),  # vLLM reads a multiple
        (("--tensor-parallel-size", "2"), ("--tensor-parallel-size", "4"), None, None, None),
        (("--tensor-parallel-size", "2"), ("--tensor-parallel-size", "3"), None, None, "not divisible"),
    ],
)
async def test_a_decode_refuses_an_incompatible_handoff_as_vllm_does(
    http: aiohttp.ClientSession,
    prefill_args: tuple[str, ...],
    decode_args: tuple[str, ...],
    prefill_rev: str | None,
    decode_rev: str | None,
    refusal: str | None,
) -> None:
    p_cfg = make_config("127.0.0.61", MODEL, "--kv-transfer-config", KV_CONFIG, *prefill_args, engine_rev=prefill_rev)
    d_cfg = make_config("127.0.0.62", MODEL, "--kv-transfer-config", KV_CONFIG, *decode_args, engine_rev=decode_rev)
    async with running(p_cfg) as prefill, running(d_cfg) as decode:
        status, doc = await _handoff(http, prefill, decode)
    if refusal is None:
        assert status == 200, doc
        assert doc["usage"]["completion_tokens"] == 4
    else:
        assert status == 500, doc
        error = doc["error"]
        assert (error["type"], error["code"]) == ("InternalServerError", 500)
        assert "KV transfer from" in error["message"] and refusal in error["message"]


@pytest.mark.parametrize(
    ("prefill_release", "decode_release", "refusal"),
    [
        ("0.11.0", "0.11.0", None),
        ("0.11.0", "0.12.0", "version 0.12.0 != remote 0.11.0"),  # an upgrade's old prefill, new decode
        (None, None, None),  # told no release: nothing to compare
    ],
)
async def test_a_decode_refuses_kv_from_another_engine_release(
    http: aiohttp.ClientSession, prefill_release: str | None, decode_release: str | None, refusal: str | None
) -> None:
    p_cfg = make_config("127.0.0.66", MODEL, "--kv-transfer-config", KV_CONFIG, engine_version=prefill_release)
    d_cfg = make_config("127.0.0.67", MODEL, "--kv-transfer-config", KV_CONFIG, engine_version=decode_release)
    assert handoff_facts(p_cfg).version == (prefill_release or "")
    async with running(p_cfg) as prefill, running(d_cfg) as decode:
        status, doc = await _handoff(http, prefill, decode)
    if refusal is None:
        assert status == 200, doc
    else:
        assert status == 500 and refusal in doc["error"]["message"], doc


def test_the_release_comes_from_the_env_the_local_kubelet_sets() -> None:
    cmd = ["vllm", "serve", MODEL, "--kv-transfer-config", KV_CONFIG]
    assert parse_engine_command(cmd, {}).engine_version is None
    assert parse_engine_command(cmd, {L.ENV_ENGINE_VERSION: "0.12.0"}).engine_version == "0.12.0"


async def test_recompute_policy_decodes_anyway(http: aiohttp.ClientSession) -> None:
    p_cfg = make_config("127.0.0.63", MODEL, "--kv-transfer-config", KV_CONFIG, engine_rev="aaaa")
    d_cfg = make_config("127.0.0.64", MODEL, "--kv-transfer-config", RECOMPUTE, engine_rev="bbbb")
    async with running(p_cfg) as prefill, running(d_cfg) as decode:
        status, doc = await _handoff(http, prefill, decode)
    assert status == 200 and doc["usage"]["completion_tokens"] == 4


def test_the_revision_comes_from_the_env_the_operator_sets() -> None:
    cmd = ["vllm", "serve", MODEL, "--kv-transfer-config", KV_CONFIG]
    assert parse_engine_command(cmd, {}).engine_rev is None
    assert parse_engine_command(cmd, {L.ENV_ENGINE_REV: "0123abcdef"}).engine_rev == "0123abcdef"
    flagged = parse_engine_command(cmd, {L.ENV_ENGINE_REV: "x"}, flags={"engine_rev": "fromflag"})
    assert flagged.engine_rev == "fromflag"
    with pytest.raises(CommandLineError, match="XPYD_ENGINE_REV"):
        parse_engine_command(cmd, {L.ENV_ENGINE_REV: "not a label!"})


def test_the_facts_come_from_the_command_line() -> None:
    cfg = make_config("127.0.0.65", MODEL, "--kv-transfer-config", KV_CONFIG, "--block-size", "32",
                      "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "2")  # fmt: skip
    facts = handoff_facts(cfg)
    assert (facts.kind, facts.connector, facts.block_size, facts.kv_cache_dtype, facts.tp) == (
        "vllm", "NixlConnector", "32", "fp8", 2,
    )  # fmt: skip
    worker = Worker(replace(cfg, engine_rev="r1"))
    assert worker.handshake()["engine_rev"] == "r1"
    assert worker.handshake_problem({"facts": {"bogus": 1}}) == "malformed handshake from the prefill's side channel"
    assert worker.handshake_problem({}) is None
