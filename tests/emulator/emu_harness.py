"""Helpers that run emulator servers in-process on loopback addresses."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp

from xpyd_emulator.cmdline import EmulatorConfig, parse_engine_command
from xpyd_emulator.server import serve
from xpyd_emulator.worker import Worker

KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def make_config(
    host: str, model: str = "meta-llama/Llama-3.1-8B-Instruct", *args: str, **fields: Any
) -> EmulatorConfig:
    env = {"XPYD_BIND_HOST": host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(host))}
    cmd = ["vllm", "serve", model, "--port", str(free_port(host)), *args]
    return replace(parse_engine_command(cmd, env, speedup=fields.pop("speedup", 50.0)), **fields)


@contextlib.asynccontextmanager
async def _served(
    cfg: EmulatorConfig, worker: Worker | None, path: str, drain: float, tries: int
) -> AsyncIterator[str]:
    """Serve until the block exits; yields the base URL once `path` answers 200 (or `tries` polls pass)."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(cfg, stop, drain_seconds=drain, worker=worker))
    base = f"http://{cfg.host}:{cfg.port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(tries):
            if task.done():
                task.result()
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + path) as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.01)
    try:
        yield base
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[str]:
    """Serve a Worker the test can reach into; yields the base URL once /version answers."""
    async with _served(worker.cfg, worker, "/version", 0.5, 300) as base:
        yield base


@contextlib.asynccontextmanager
async def running(cfg: EmulatorConfig) -> AsyncIterator[str]:
    """Serve `cfg` until the block exits; yields the base URL once /health answers."""
    async with _served(cfg, None, "/health", 5, 200) as base:
        yield base
