"""The aiohttp application: routes, the upstream client session, the /metrics scraper, discovery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import WORKER_ROLES
from xpyd_router.pool import WorkerPool
from xpyd_router.proxy import JSON, Proxy, ProxyConfig, error_response
from xpyd_router.scrape import parse_metrics

Background = Callable[[WorkerPool], Coroutine[Any, Any, None]]


async def scrape_once(session: aiohttp.ClientSession, pool: WorkerPool, metrics: RouterMetrics) -> None:
    async def one(name: str) -> None:
        try:
            async with session.get(name + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                text = await resp.text() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            text = None
        pool.apply_metrics(name, parse_metrics(text) if text is not None else None)

    await asyncio.gather(*(one(name) for name in list(pool.workers)))
    for role in WORKER_ROLES:
        members = [w for w in pool.workers.values() if w.role == role]
        ready = sum(1 for w in members if w.healthy and not w.draining)
        draining = sum(1 for w in members if w.draining)
        metrics.workers.labels(metrics.deployment, role, "ready").set(ready)
        metrics.workers.labels(metrics.deployment, role, "draining").set(draining)
        metrics.workers.labels(metrics.deployment, role, "unhealthy").set(len(members) - ready - draining)


async def scrape_loop(
    session: aiohttp.ClientSession, pool: WorkerPool, metrics: RouterMetrics, interval: float
) -> None:
    while True:
        await scrape_once(session, pool, metrics)
        await asyncio.sleep(interval)


def build_app(
    pool: WorkerPool,
    metrics: RouterMetrics,
    config: ProxyConfig,
    scrape_interval: float = 1.0,
    background: list[Background] | None = None,
    max_body_bytes: int = 32 << 20,
) -> web.Application:
    proxy = Proxy(pool, metrics, config)
    app = web.Application(client_max_size=max_body_bytes)

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_connect=5)
        proxy.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(job(pool)) for job in background or []]
        tasks.append(asyncio.create_task(scrape_loop(proxy.session, pool, metrics, scrape_interval)))
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await proxy.session.close()
        proxy.upstream.close()

    async def models(_: web.Request) -> web.Response:
        assert proxy.session is not None
        for role in ("decode", "worker", "prefill"):
            for worker in pool.ready(role):
                try:
                    async with proxy.session.get(worker.name + "/v1/models") as resp:
                        return web.Response(status=resp.status, body=await resp.read(), content_type=JSON)
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pool.mark_failed(worker.name)
        return error_response(503, "no ready worker to list models", "service_unavailable")

    async def health(_: web.Request) -> web.Response:
        counts = {role: len(pool.ready(role)) for role in ("prefill", "decode", "worker")}
        if counts["decode"] or counts["worker"]:
            return web.json_response({"status": "ok", "ready": counts})
        return error_response(503, f"no ready decode or co-located worker (ready: {counts})", "unavailable")

    async def prometheus(_: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/v1/chat/completions", proxy.chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    return app
