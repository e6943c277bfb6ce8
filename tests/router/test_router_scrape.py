"""Parsing the vLLM (and SGLang) /metrics series the router routes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from xpyd_api.engines import METRICS
from xpyd_router import scrape
from xpyd_router.health import HealthChecker
from xpyd_router.policy.registry import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec
from xpyd_router.scrape import parse_metrics

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:prefix_cache_hits_total{model_name="m"} 100.0
"""


@pytest.mark.parametrize(
    ("text", "waiting", "running", "usage", "capacity"),
    [
        (VLLM, 3.0, 7.0, 0.25, 16 * 2048),
        ("", 0.0, 0.0, 0.0, 0),
        ('garbage line\nvllm:num_requests_waiting{x="1"} notanumber\n', 0.0, 0.0, 0.0, 0),
        ("vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting 1\n", 1.0, 0.0, 0.5, 0),
        (
            'sglang:num_queue_reqs{m="a"} 4\nsglang:num_running_reqs 6\nsglang:token_usage 0.7\n',
            4.0,
            6.0,
            0.7,
            0,
        ),
    ],
)
def test_parse(text: str, waiting: float, running: float, usage: float, capacity: int) -> None:
    m = parse_metrics(text)
    assert (m.waiting, m.running, m.kv_usage, m.capacity_tokens) == (waiting, running, usage, capacity)


@pytest.mark.parametrize("kind", sorted(METRICS))
@pytest.mark.parametrize("usage_name", [0, -1])  # every name of a renamed gauge (vLLM's older one too)
def test_each_engines_names_from_the_profile_are_read(kind: str, usage_name: int) -> None:
    names = METRICS[kind]
    text = (
        f'{names.waiting}{{model_name="m"}} 2\n{names.running}{{model_name="m"}} 3\n'
        f'{names.kv_usage[usage_name]}{{model_name="m"}} 0.4\n'
    )
    m = parse_metrics(text)
    assert (m.waiting, m.running, m.kv_usage) == (2.0, 3.0, 0.4)


def test_the_scraper_takes_its_names_from_the_engine_profiles() -> None:
    wanted = {n for m in METRICS.values() for n in (m.waiting, m.running, *m.kv_usage)}
    assert set(scrape.ALIASES) == wanted
    assert "vllm:gpu_cache_usage_perc" in scrape.ALIASES


@asynccontextmanager
async def checked_worker(
    metrics: Callable[[web.Request], Awaitable[web.Response]], healthy: bool = False, probe_s: float = 2.0
) -> AsyncIterator[tuple[WorkerPool, HealthChecker, str]]:
    """A worker on loopback answering /health at once and /metrics with `metrics`, in a pool (up or down) with a
    health checker whose probes and scrapes time out after `probe_s` seconds."""

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    pool = WorkerPool(KvAwarePolicy(), 256)
    pool.set_workers([WorkerSpec(url, "worker")])
    pool.workers[url].healthy = healthy
    async with aiohttp.ClientSession() as session:
        checker = HealthChecker(session, pool, timeout=probe_s)
        try:
            yield pool, checker, url
        finally:
            await checker.close()
            await runner.cleanup()


@pytest.mark.parametrize(("status", "body", "healthy"), [(404, "", True), (200, "vllm:num_requests_waiting 2\n", True),
                                                         (500, "", False)])  # fmt: skip
async def test_a_worker_without_metrics_stays_up(status: int, body: str, healthy: bool) -> None:
    """SGLang serves /metrics only with --enable-metrics: a 404 there is a live worker with no figures."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(status=status, text=body)

    async with checked_worker(metrics) as (pool, checker, url):
        await checker.check(url)
        assert pool.workers[url].healthy is healthy


@pytest.mark.parametrize("was_up", [False, True])
async def test_a_worker_that_answers_health_but_metrics_late_is_up(was_up: bool) -> None:
    """An engine busy computing (a CPU vLLM under load) answers /health at once and /metrics late: a worker coming
    up is alive by the probe it just passed, so it comes up without figures rather than waiting for a quiet
    scrape; one already up stays up through a slow scrape (pool.SLOW_SCRAPES)."""

    async def metrics(_: web.Request) -> web.Response:
        await asyncio.sleep(2.0)
        return web.Response(text="vllm:num_requests_waiting 2\n")

    async with checked_worker(metrics, healthy=was_up, probe_s=0.3) as (pool, checker, url):
        await checker.check(url)
        assert pool.workers[url].healthy
        assert pool.workers[url].waiting == 0  # no figure read: none made up
