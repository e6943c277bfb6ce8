"""SIGTERM drains like a vLLM pod: readiness 503 at once, running work and promised KV finish, bounded exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from emu_harness import KV_CONFIG, free_port, make_config, running  # type: ignore[import-not-found]

XPYD = str(Path(sys.executable).with_name("xpyd"))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFILL_HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


@contextlib.asynccontextmanager
async def emulator(host: str, *flags: str, **env: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """An `xpyd emulate` prefill process with NIXL on `host`; yields it and its base URL once healthy."""
    port = free_port(host)
    environ = dict(os.environ, XPYD_BIND_HOST=host, XPYD_SPEEDUP="1", XPYD_GPU="H100",
                   VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port(host)), **env)  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        XPYD, "emulate", "--log-level", "WARNING", *flags, "--", "vllm", "serve", MODEL, "--port", str(port),
        "--kv-transfer-config", KV_CONFIG, env=environ, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://{host}:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(500):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.02)
        yield proc, base
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, data=orjson.dumps(body)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_sigterm_drains_requests_and_leased_kv_then_exits() -> None:
    async with (
        emulator("127.0.0.51", "--drain-timeout", "20") as (proc, prefill),
        running(make_config("127.0.0.52", MODEL, "--kv-transfer-config", KV_CONFIG)) as decode,
        aiohttp.ClientSession() as http,
    ):
        request = {"model": MODEL, "prompt": "shared context " * 100, "max_tokens": 4}
        status, hop1 = await post(http, prefill + "/v1/completions",
                                  dict(request, max_tokens=1, kv_transfer_params=PREFILL_HOP))  # fmt: skip
        assert status == 200
        running_one = asyncio.create_task(post(http, prefill + "/v1/completions", {"prompt": "x", "max_tokens": 200}))
        await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.1)
        async with http.get(prefill + "/health") as resp:
            assert resp.status == 503
        status, doc = await post(http, prefill + "/v1/completions", {"prompt": "new", "max_tokens": 1})
        assert (status, doc["error"]["type"]) == (503, "ServiceUnavailableError")
        status, doc = await running_one
        assert (status, doc["usage"]["completion_tokens"]) == (200, 200)
        await asyncio.sleep(0.3)
        assert proc.returncode is None  # the decode has not pulled its KV yet
        hop2 = dict(request, kv_transfer_params=hop1["kv_transfer_params"])
        status, doc = await post(http, decode + "/v1/completions", hop2)
        assert (status, doc["usage"]["completion_tokens"]) == (200, 4)
        assert await asyncio.wait_for(proc.wait(), 5) == 0


async def test_drain_is_bounded_and_a_second_signal_ends_it() -> None:
    for second_signal in (False, True):
        async with (
            emulator("127.0.0.53", "--drain-timeout", "1" if not second_signal else "30") as (proc, base),
            aiohttp.ClientSession() as http,
        ):
            hop = {"prompt": "p " * 80, "max_tokens": 1, "kv_transfer_params": PREFILL_HOP}
            assert (await post(http, base + "/v1/completions", hop))[0] == 200  # a lease nobody will pull
            loop = asyncio.get_running_loop()
            start = loop.time()
            proc.send_signal(signal.SIGTERM)
            if second_signal:
                await asyncio.sleep(0.3)
                proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            assert loop.time() - start < 4.0


async def test_a_draining_decode_still_takes_kv_promised_to_it() -> None:
    p_cfg = make_config("127.0.0.54", MODEL, "--kv-transfer-config", KV_CONFIG)
    d_cfg = make_config("127.0.0.55", MODEL, "--kv-transfer-config", KV_CONFIG, speedup=1.0)
    stop = asyncio.Event()
    from xpyd_emulator.server import serve

    async with running(p_cfg) as prefill, aiohttp.ClientSession() as http:
        decode_server = asyncio.create_task(serve(d_cfg, stop, drain_seconds=10))
        decode = f"http://{d_cfg.host}:{d_cfg.port}"
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(decode + "/health") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.01)
        request = {"prompt": "ctx " * 400, "max_tokens": 300}
        _, hop1 = await post(http, prefill + "/v1/completions", dict(request, max_tokens=1,
                                                                      kv_transfer_params=PREFILL_HOP))  # fmt: skip
        in_flight = asyncio.create_task(post(http, decode + "/v1/completions",
                                             dict(request, kv_transfer_params=hop1["kv_transfer_params"])))  # fmt: skip
        await asyncio.sleep(0.05)
        stop.set()  # SIGTERM while the decode generates
        await asyncio.sleep(0.05)
        status, doc = await post(http, decode + "/v1/completions", {"prompt": "fresh", "max_tokens": 1})
        assert status == 503
        _, hop1b = await post(http, prefill + "/v1/completions", dict(request, max_tokens=1,
                                                                       kv_transfer_params=PREFILL_HOP))  # fmt: skip
        late = dict(request, max_tokens=2, kv_transfer_params=hop1b["kv_transfer_params"])
        assert (await post(http, decode + "/v1/completions", late))[0] == 200  # routed before readiness flipped
        status, doc = await in_flight
        assert (status, doc["usage"]["completion_tokens"]) == (200, 300)
        await asyncio.wait_for(decode_server, 10)
