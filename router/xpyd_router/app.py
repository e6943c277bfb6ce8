"""The router's routes and its lifecycle: the client session for probes, worker health checks, discovery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from xpyd_http.messages import Reply, Request, Routes, error_reply
from xpyd_router.health import HealthChecker, health_loop, publish
from xpyd_router.metrics import RouterMetrics
from xpyd_router.pool import WorkerPool
from xpyd_router.proxy import Proxy, ProxyConfig
from xpyd_router.targets import split_target

Background = Callable[[WorkerPool], Coroutine[Any, Any, None]]
MODELS_TIMEOUT = 5.0  # seconds for one worker's /v1/models


def served_models(name: str) -> bytes:
    """An OpenAI model list of one model, as the engines write it."""
    return orjson.dumps({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "xpyd"}]})


_ERRORS = (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError)


@dataclass
class App:
    """What xpyd_http.server serves, and what must run while it does (`async with app.running():`)."""

    routes: Routes
    running: Callable[[], contextlib.AbstractAsyncContextManager[None]]


def build_app(
    pool: WorkerPool,
    metrics: RouterMetrics,
    config: ProxyConfig,
    scrape_interval: float = 1.0,
    background: list[Background] | None = None,
) -> App:
    proxy = Proxy(pool, metrics, config)

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=30, connect=config.connect_timeout)
        session = proxy.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        checker = HealthChecker(session, pool)
        warm = None
        if config.warm_pairs:  # one tiny handoff per new prefill/decode pair (warmup.py)
            from xpyd_router.warmup import Warmup

            warm = Warmup(pool, proxy.upstream, session, proxy.hops.handoff, metrics=metrics)
            pool.on_ready = warm.ready
        # Every worker, static or discovered, answers /health before its first request.
        for worker in pool.workers.values():
            worker.healthy = False
        pool.on_added = checker.check_soon
        await checker.check_all()
        publish(pool, metrics)
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(job(pool)) for job in background or []]
        tasks.append(asyncio.create_task(health_loop(checker, metrics, scrape_interval)))
        try:
            yield
        finally:
            pool.on_added = None
            pool.on_ready = None
            if warm is not None:
                await warm.close()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await checker.close()
            await session.close()
            proxy.close()

    # The last list a worker gave: a pool scaled to zero keeps its model listed, so clients (and the
    # waiting room) still see the demand that wakes it; before any worker answered, --served-model's.
    listed: list[bytes] = [served_models(proxy.config.served_model)] if proxy.config.served_model else []

    async def models(request: Request) -> Reply:
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
                    listed[:] = [data]
                    return Reply(200, data)
            except _ERRORS:
                continue
        if listed and proxy.hold.enabled:
            return Reply(200, listed[0])
        return error_reply(503, "no worker could list the models", "service_unavailable")

    async def health(_: Request) -> Reply:
        counts = {role: len(pool.ready(role)) for role in ("prefill", "decode", "worker")}
        if counts["decode"] or counts["worker"]:
            return Reply(200, orjson.dumps({"status": "ok", "ready": counts}))
        if proxy.hold.enabled:  # pools at zero: the router is what takes (and holds) the requests that wake them
            return Reply(200, orjson.dumps({"status": "holding", "ready": counts, "held": proxy.hold.held}))
        return error_reply(503, f"no ready decode or co-located worker (ready: {counts})", "unavailable")

    async def prometheus(_: Request) -> Reply:
        return Reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)

    routes: Routes = {
        ("POST", "/v1/completions"): proxy.completions,
        ("POST", "/v1/chat/completions"): proxy.chat,
        ("GET", "/v1/models"): models,
        ("GET", "/health"): health,
        ("GET", "/metrics"): prometheus,
    }
    return App(routes, running)
