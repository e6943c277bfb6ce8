"""`xpyd emulate` as a process: reads a vLLM command line and env, binds XPYD_BIND_HOST, drains on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
from emu_harness import free_port  # type: ignore[import-not-found]

XPYD = str(Path(sys.executable).with_name("xpyd"))


async def test_sigterm_finishes_in_flight_then_exits() -> None:
    host = "127.0.0.4"
    port = free_port(host)
    env = dict(os.environ, XPYD_BIND_HOST=host, XPYD_SPEEDUP="1", XPYD_GPU="H100")
    proc = await asyncio.create_subprocess_exec(
        XPYD, "emulate", "--log-level", "WARNING", "--", "python3", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", str(port),
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    base = f"http://{host}:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(base + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.02)
            body = {"prompt": "hello", "max_tokens": 120}
            inflight = asyncio.create_task(http.post(base + "/v1/completions", json=body))
            await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            resp = await asyncio.wait_for(inflight, 15)
            doc = await resp.json()
            assert resp.status == 200
            assert doc["usage"]["completion_tokens"] == 120
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_bad_command_line_exits_with_a_clear_error() -> None:
    proc = await asyncio.create_subprocess_exec(
        XPYD, "emulate", "--", "llama-server", "-m", "x", stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 2
    assert b"not a vLLM or SGLang command line" in err
