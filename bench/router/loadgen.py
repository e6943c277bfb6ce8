"""Load generator, run in its own process: closed-loop (fixed concurrency) or open-loop (trace replay)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import uvloop


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float, bool]:
    """(time to first byte of content, total latency, ok) of one request."""
    start = time.perf_counter()
    first = 0.0
    try:
        async with session.post(url, json=body) as resp:
            if body.get("stream"):
                async for line in resp.content:
                    if not first and line.startswith(b"data: {"):
                        first = time.perf_counter() - start
            else:
                await resp.read()
                first = time.perf_counter() - start
            ok = resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    return first, time.perf_counter() - start, ok


def _session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))


async def closed_loop(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    queue = list(reversed(bodies))
    results: list[tuple[float, float, bool]] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            results.append(await _one(session, url, queue.pop()))

    async with _session(concurrency) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "results": results}


async def open_loop(url: str, bodies: list[dict[str, Any]], arrivals: list[float]) -> dict[str, Any]:
    async with _session(4096) as session:
        start = time.perf_counter()

        async def at(offset: float, body: dict[str, Any]) -> tuple[float, float, bool]:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await _one(session, url, body)

        results = await asyncio.gather(*(at(t, b) for t, b in zip(arrivals, bodies, strict=True)))
        elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "results": list(results)}


def main() -> None:
    spec = json.load(sys.stdin)
    if spec["mode"] == "closed":
        job = closed_loop(spec["url"], spec["bodies"], spec["concurrency"])
    else:
        job = open_loop(spec["url"], spec["bodies"], spec["arrivals"])
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out = runner.run(job)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
