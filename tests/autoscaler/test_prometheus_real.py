"""The autoscaler's PromQL against a real Prometheus (Debian's binary) scraping stand-in workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from aiohttp import web

from realprom import free_port, running, serve_pages, stop_pages  # type: ignore[import-not-found]  # tests/ on sys.path
from xpyd_operator.autoscaling.datapath import PairsHealth, Trip
from xpyd_operator.autoscaling.prometheus import PrometheusClient
from xpyd_operator.autoscaling.types import PoolMetrics, PrometheusError

T = TypeVar("T")

pytestmark = pytest.mark.slow


@dataclass
class Worker:
    """A /metrics endpoint shaped like vLLM's, with gauges the test sets."""

    waiting: float
    kv: float = 0.0
    started: float = field(default_factory=time.time)
    runner: web.AppRunner | None = None
    port: int = 0

    def exposition(self) -> str:
        up = time.time() - self.started
        return "\n".join(
            [
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting {self.waiting}",
                "# TYPE vllm:num_requests_running gauge",
                "vllm:num_requests_running 1",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc {self.kv}",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total {1000.0 * up:.3f}",
                "# TYPE vllm:time_to_first_token_seconds histogram",  # every request in (0.25, 0.5]
                'vllm:time_to_first_token_seconds_bucket{le="0.25"} 0',
                f'vllm:time_to_first_token_seconds_bucket{{le="0.5"}} {10.0 * up:.3f}',
                f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {10.0 * up:.3f}',
                f"vllm:time_to_first_token_seconds_count {10.0 * up:.3f}",
                f"vllm:time_to_first_token_seconds_sum {4.0 * up:.3f}",
                "# TYPE vllm:request_prompt_tokens histogram",  # 8 of 10 prompts in (1000, 2000], 2 in (5000, 10000]
                'vllm:request_prompt_tokens_bucket{le="1000.0"} 0',
                f'vllm:request_prompt_tokens_bucket{{le="2000.0"}} {8.0 * up:.3f}',
                f'vllm:request_prompt_tokens_bucket{{le="5000.0"}} {8.0 * up:.3f}',
                f'vllm:request_prompt_tokens_bucket{{le="10000.0"}} {10.0 * up:.3f}',
                f'vllm:request_prompt_tokens_bucket{{le="+Inf"}} {10.0 * up:.3f}',
                f"vllm:request_prompt_tokens_count {10.0 * up:.3f}",
                f"vllm:request_prompt_tokens_sum {30000.0 * up:.3f}",
                "",
            ]
        )

    async def start(self) -> None:
        async def metrics(_req: web.Request) -> web.Response:
            return web.Response(text=self.exposition(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def workers() -> AsyncIterator[dict[str, Worker]]:
    ws = {
        "llama-prefill-0": Worker(waiting=3),
        "llama-prefill-1": Worker(waiting=1),
        "llama-decode-0": Worker(waiting=0, kv=0.6),
        "other-prefill-0": Worker(waiting=100),  # another deployment: must not be counted
    }
    for w in ws.values():
        await w.start()
    yield ws
    for w in ws.values():
        await w.stop()


@pytest.fixture
def prometheus(workers: dict[str, Worker], tmp_path: Path) -> Iterator[str]:
    targets = [
        {
            "targets": [f"127.0.0.1:{w.port}"],
            "labels": {
                "namespace": "ns",
                "pod": pod,
                "xpyd_deployment": pod.split("-")[0],
                "xpyd_role": pod.split("-")[1],
            },
        }
        for pod, w in workers.items()
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "workers", "static_configs": targets}],
    }
    with running(tmp_path, config) as url:
        yield url


async def poll(fetch: Callable[[], Awaitable[T]], ok: Callable[[T], bool], first: T, tries: int = 60) -> T:
    """Poll (at most ``tries`` x 0.5 s) until Prometheus's answer, ``fetch()``, satisfies ``ok``."""
    got = first
    for _ in range(tries):
        try:
            got = await fetch()
            if ok(got):
                return got
        except PrometheusError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"Prometheus never answered as expected; last answer {got}")


async def until(
    c: PrometheusClient, ok: Callable[[dict[str, PoolMetrics]], bool], tries: int = 60
) -> dict[str, PoolMetrics]:
    """The pools' metrics once they satisfy ``ok``."""

    def fetch() -> Awaitable[dict[str, PoolMetrics]]:
        return c.observe("ns", "llama", ["prefill", "decode"], stale_after=30, rate_window="5s")

    return await poll(fetch, ok, {}, tries)


async def test_pool_metrics_from_real_prometheus(prometheus: str, workers: dict[str, Worker]) -> None:
    async with PrometheusClient(prometheus, timeout=2) as c:
        # each field is its own query: wait until every one has seen both prefill workers and the decode one
        def complete(g: dict[str, PoolMetrics]) -> bool:
            p, d = g["prefill"], g["decode"]
            fields = (p.running, p.ttft_p90, p.prompt_tokens_p99, d.waiting, d.kv_usage)
            return p.reporting == 2 and (p.prompt_tokens_rate or 0) > 1500 and None not in fields

        got = await until(c, complete)
        p, d = got["prefill"], got["decode"]
        assert (p.waiting, p.running, p.reporting) == (4.0, 2.0, 2)  # the other deployment is excluded
        assert (d.waiting, d.kv_usage, d.reporting) == (0.0, 0.6, 1)
        assert p.ttft_p90 == pytest.approx(0.475)  # 90 % into the (0.25, 0.5] bucket
        assert p.prompt_tokens_rate is not None
        assert p.prompt_tokens_rate < 2500
        assert p.sampled_at is not None
        assert abs(p.sampled_at - time.time()) < 30
        assert d.itl_p90 is None  # no such histogram: no quantile, not NaN
        # ranks 5, 9 and 9.9 of every 10 prompts, each linear within its bucket
        quantiles = (p.prompt_tokens_p50, p.prompt_tokens_p90, p.prompt_tokens_p99)
        assert quantiles == pytest.approx((1000 + 1000 * 5 / 8, 7500.0, 9750.0), rel=0.02)

        # A worker that stops answering goes stale and leaves the sums.
        await workers["llama-prefill-1"].stop()
        # (reporting and waiting are separate queries: wait until both have seen the stale marker)
        got = await until(c, lambda g: g["prefill"].reporting == 1 and g["prefill"].waiting == 3.0)
        assert (got["prefill"].waiting, got["prefill"].reporting) == (3.0, 1)


async def test_unreachable_prometheus_is_a_reason() -> None:
    async with PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=1) as c:
        with pytest.raises(PrometheusError) as info:
            await c.observe("ns", "llama", ["prefill"])
    assert info.value.reason == "PrometheusUnreachable"


async def test_pairs_from_real_prometheus(tmp_path: Path) -> None:
    """The routers' pairs: the cooling gauge summed, and both a counted trip and a pair's first trip (a series that
    appears at 1, which increase() misses) named; another deployment's router is not counted."""
    trips = {("p0", "d0", "failures"): 1.0}  # tripped before the window: not named until it trips again
    cooling = {"llama": 1.0, "other": 5.0}

    def page(dep: str) -> Callable[[], str]:
        def text() -> str:
            lines = [
                "# TYPE xpyd_router_pairs_cooling_off gauge",
                f'xpyd_router_pairs_cooling_off{{deployment="{dep}"}} {cooling[dep]}',
                "# TYPE xpyd_router_pair_trips_total counter",
            ]
            lines += [
                f'xpyd_router_pair_trips_total{{deployment="{dep}",prefill="{p}",decode="{d}",reason="{r}"}} {n}'
                for (p, d, r), n in trips.items()
            ]
            return "\n".join(lines) + "\n"

        return text

    server = serve_pages({"/llama": page("llama"), "/other": page("other")})
    port = server.server_address[1]
    job = {
        "job_name": "routers",
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "ns"}}],
        "relabel_configs": [{"target_label": "__metrics_path__", "replacement": "/llama"}],
    }
    other = {
        **job,
        "job_name": "other",
        "relabel_configs": [{"target_label": "__metrics_path__", "replacement": "/other"}],
    }
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [job, other]}
    try:
        with running(tmp_path, config) as url:
            async with PrometheusClient(url, timeout=2) as c:

                async def pairs(ok: Callable[[PairsHealth], bool]) -> PairsHealth:
                    return await poll(lambda: c.pairs("ns", "llama", window="4s"), ok, PairsHealth(None))

                await pairs(lambda g: g.cooling == 1.0 and not g.trips)  # the old trip left the window
                trips[("p0", "d0", "failures")] = 2.0  # tripped again
                trips[("p1", "d0", "slow")] = 1.0  # a first trip
                got = await pairs(lambda g: len(g.trips) == 2)
                assert got == PairsHealth(1.0, (Trip("p0", "d0", "failures"), Trip("p1", "d0", "slow")))
    finally:
        stop_pages(server)
