"""The injected KV-pull fault (`--fault-kv-pull-*`): pulls from the named prefill peers fail as vLLM's failed NIXL
read does (HTTP 500) or take longer, only while the fault is on, and never touch pulls from other peers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from emu_harness import KV_CONFIG, make_config, running, serving  # type: ignore[import-not-found]

from xpyd_emulator.cli import configure
from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.faults import KvPullFault, parse_peer
from xpyd_emulator.worker import Worker

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SERVE = ["--", "vllm", "serve", MODEL, "--kv-transfer-config", KV_CONFIG]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _handoff(http: aiohttp.ClientSession, prefill: str, decode: str) -> tuple[int, Any, float]:
    """One prefill then one decode of its KV: the decode's status, body and seconds."""
    request = {"model": MODEL, "prompt": "shared context " * 50, "max_tokens": 2}
    hop1 = dict(request, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    async with http.post(prefill + "/v1/completions", data=orjson.dumps(hop1)) as resp:
        assert resp.status == 200
        kv = orjson.loads(await resp.read())["kv_transfer_params"]
    start = time.monotonic()
    async with http.post(decode + "/v1/completions", data=orjson.dumps(dict(request, kv_transfer_params=kv))) as resp:
        return resp.status, orjson.loads(await resp.read()), time.monotonic() - start


def test_the_flags_repeat_and_are_checked() -> None:
    cfg, _ = configure(["--fault-kv-pull-fail-from", "127.0.0.1:5601", "--fault-kv-pull-fail-from", "prefill-0",
                        "--fault-kv-pull-at", "SIGUSR1", "--fault-kv-pull-for", "5", *SERVE], {})  # fmt: skip
    assert cfg.fault_kv_pull_fail_from == "127.0.0.1:5601,prefill-0"
    assert (cfg.fault_kv_pull_at, cfg.fault_kv_pull_for, cfg.fault_kv_pull_delay) == (None, 5.0, 1.0)
    fault = KvPullFault.from_config(cfg)
    assert fault is not None and fault.fail_from == {("127.0.0.1", 5601), ("prefill-0", None)}
    cfg, _ = configure(SERVE, {"XPYD_FAULT_KV_PULL_SLOW_FROM": "[::1]:5600", "XPYD_FAULT_KV_PULL_DELAY": "2"})
    fault = KvPullFault.from_config(cfg)
    assert fault is not None and fault.slow_from == {("::1", 5600)} and fault.delay == 2.0 and fault.at == 0.0
    assert KvPullFault.from_config(configure(SERVE, {})[0]) is None  # no fault, no cost
    for argv, named in [
        (["--fault-kv-pull-fail-from", "127.0.0.1:99999"], "--fault-kv-pull-fail-from"),
        (["--fault-kv-pull-slow-from", "bad host!"], "--fault-kv-pull-slow-from"),
        (["--fault-kv-pull-at", "soon"], "--fault-kv-pull-at"),
        (["--fault-kv-pull-for", "0"], "--fault-kv-pull-for"),
    ]:
        with pytest.raises(CommandLineError, match=named):
            configure([*argv, *SERVE], {})
    assert parse_peer("Prefill-0.svc:5600") == ("prefill-0.svc", 5600)


async def test_pulls_from_the_named_peer_fail_as_vllm_answers_and_others_work(http: aiohttp.ClientSession) -> None:
    bad = make_config("127.0.0.71", MODEL, "--kv-transfer-config", KV_CONFIG)
    good = make_config("127.0.0.72", MODEL, "--kv-transfer-config", KV_CONFIG)
    decode = make_config("127.0.0.73", MODEL, "--kv-transfer-config", KV_CONFIG,
                         fault_kv_pull_fail_from=f"127.0.0.71:{bad.side_channel_port}")  # fmt: skip
    worker = Worker(decode)
    async with running(bad) as p_bad, running(good) as p_good, serving(worker) as d:
        status, doc, _ = await _handoff(http, p_bad, d)
        assert status == 500, doc
        assert (doc["error"]["type"], doc["error"]["code"]) == ("InternalServerError", 500)
        assert "KV transfer from" in doc["error"]["message"] and "127.0.0.71" in doc["error"]["message"]
        status, doc, _ = await _handoff(http, p_good, d)
        assert status == 200 and doc["usage"]["completion_tokens"] == 2
        async with http.get(d + "/metrics") as resp:
            assert "vllm:nixl_num_failed_transfers_total" in await resp.text()
    assert sum(m.nixl_failed for m in worker.rank_metrics) == 1


async def test_the_fault_starts_when_told_and_ends_after_its_time(http: aiohttp.ClientSession) -> None:
    prefill = make_config("127.0.0.74", MODEL, "--kv-transfer-config", KV_CONFIG)
    decode = make_config("127.0.0.75", MODEL, "--kv-transfer-config", KV_CONFIG, fault_kv_pull_at=None,
                         fault_kv_pull_for=0.5, fault_kv_pull_fail_from="127.0.0.74")  # fmt: skip
    worker = Worker(decode)
    async with running(prefill) as p, serving(worker) as d:
        assert (await _handoff(http, p, d))[0] == 200  # armed for SIGUSR1, not started
        assert worker.fault is not None
        worker.fault.begin()  # what SIGUSR1 does (the fault suite sends the signal to a process)
        assert (await _handoff(http, p, d))[0] == 500
        await asyncio.sleep(0.6)  # past the fault's end
        assert (await _handoff(http, p, d))[0] == 200


async def test_a_slow_pull_takes_its_delay_and_succeeds(http: aiohttp.ClientSession) -> None:
    prefill = make_config("127.0.0.76", MODEL, "--kv-transfer-config", KV_CONFIG)
    decode = make_config("127.0.0.77", MODEL, "--kv-transfer-config", KV_CONFIG, zero_delay=True,
                         fault_kv_pull_slow_from="127.0.0.76", fault_kv_pull_delay=0.4)  # fmt: skip
    async with running(prefill) as p, running(decode) as d:
        status, doc, seconds = await _handoff(http, p, d)
    assert status == 200 and doc["usage"]["completion_tokens"] == 2
    assert seconds >= 0.4
