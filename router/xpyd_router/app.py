"""The aiohttp application: routes, the upstream client session, worker health checks, discovery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from xpyd_router.health import HealthChecker, health_loop, publish
from xpyd_router.metrics import RouterMetrics
from xpyd_router.pool import WorkerPool
from xpyd_router.proxy import JSON, Proxy, ProxyConfig, error_response
from xpyd_router.targets import split_target

Background = Callable[[WorkerPool], Coroutine[Any, Any, None]]
MODELS_TIMEOUT = 5.0  # seconds for one worker's /v1/models
_ERRORS = (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError)


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
        timeout = aiohttp.ClientTimeout(total=30, connect=config.connect_timeout)
        session = proxy.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        checker = HealthChecker(session, pool)
        # Every worker, static or discovered, answers /health before its first request.
        for worker in pool.workers.values():
            worker.healthy = False
        pool.on_added = checker.check_soon
        await checker.check_all()
        publish(pool, metrics)
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(job(pool)) for job in background or []]
        tasks.append(asyncio.create_task(health_loop(checker, metrics, scrape_interval)))
        yield
        pool.on_added = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await checker.close()
        await session.close()
        proxy.close()

    async def models(request: web.Request) -> web.Response:
        denied = proxy.unauthorized(request)
        if denied is not None:
            return denied
        assert proxy.session is not None
        limit = aiohttp.ClientTimeout(total=MODELS_TIMEOUT)
        ready = [w.name for role in ("decode", "worker", "prefill") for w in pool.ready(role)]
        for server in dict.fromkeys(split_target(name)[0] for name in ready):  # each API server once, in order
            try:
                async with proxy.session.get(server + "/v1/models", timeout=limit) as resp:
                    data = await resp.read()
                if resp.status == 200 and isinstance(orjson.loads(data), dict):
                    return web.Response(body=data, content_type=JSON)
            except _ERRORS:
                continue
        return error_response(503, "no worker could list the models", "service_unavailable")

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
