"""Fallible workers: a request's failure is not a worker's, nothing hangs, garbage never reaches a client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from router_harness import Router  # type: ignore[import-not-found]
from stub_workers import SIDE_CHANNEL, Stub, call, events, silent_server  # type: ignore[import-not-found]

from xpyd_router import app as app_module
from xpyd_router.pool import WorkerSpec
from xpyd_router.scrape import WorkerMetrics

pytestmark = pytest.mark.timeout(30)
Start = Callable[..., Any]
FAST = {"connect_timeout": 0.5, "first_byte_timeout": 0.5, "idle_timeout": 0.3, "request_timeout": 5.0}
LONG = "You are a helpful assistant. " * 40


async def fast_router(router: Start, workers: list[Any], **extra: Any) -> Router:
    return await router(workers, scrape_interval=60, **{**FAST, **extra})  # no scrape interferes


def assert_no_address(raw: bytes, *workers: Stub) -> None:
    for w in workers:
        assert w.url.split("//")[1].encode() not in raw
    assert SIDE_CHANNEL.encode() not in raw


async def test_a_request_failing_on_every_worker_takes_none_out(stubs: Start, router: Start) -> None:
    """500 for one poisoned request: retried, answered 502, and the workers stay in rotation for others."""
    workers = [await stubs("worker", "poison"), await stubs("worker", "poison")]
    r = await fast_router(router, workers)
    status, raw = await call(r.url, {"prompt": "POISON pill"})
    assert status == 502
    error = orjson.loads(raw)["error"]
    assert error["type"] == "upstream_error"
    assert_no_address(raw, *workers)
    assert all(r.pool.workers[w.url].healthy for w in workers)
    results = await asyncio.gather(*(call(r.url, {"prompt": f"user {i}"}) for i in range(40)))
    assert [s for s, _ in results] == [200] * 40


async def test_consecutive_failures_trip_the_breaker(stubs: Start, router: Start) -> None:
    bad, good = await stubs("worker", "error500"), await stubs("worker")
    r = await fast_router(router, [bad, good])
    r.pool.breaker_hold = 60.0
    statuses = [(await call(r.url, {"prompt": f"p{i}"}))[0] for i in range(30)]
    assert statuses == [200] * 30  # each failure retried on the good worker
    assert bad.calls == r.pool.breaker_failures  # then out of rotation
    assert not r.pool.workers[bad.url].healthy
    assert r.sample("xpyd_router_errors_total", kind="breaker_open") == 1
    r.pool.apply_metrics(bad.url, WorkerMetrics())  # what a passing scrape reports
    assert not r.pool.workers[bad.url].healthy  # held out all the same


async def test_a_silent_new_worker_gets_no_traffic(stubs: Start, router: Start) -> None:
    """Accepts connections, never answers: the probe keeps it out before its first request."""
    url, server = await silent_server()
    try:
        good = await stubs("worker")
        silent = Stub(url, "worker")
        r = await fast_router(router, [silent, good])
        assert not r.pool.workers[url].healthy
        start = time.monotonic()
        results = await asyncio.gather(*(call(r.url, {"prompt": f"user {i}"}) for i in range(10)))
        assert [s for s, _ in results] == [200] * 10
        assert time.monotonic() - start < 3
    finally:
        server.close()


async def test_a_worker_discovered_later_is_probed_first(stubs: Start, router: Start) -> None:
    good = await stubs("worker")
    r = await fast_router(router, [good])
    url, server = await silent_server()
    try:
        late = await stubs("worker")
        r.pool.set_workers([WorkerSpec(good.url, "worker"), WorkerSpec(url, "worker"), WorkerSpec(late.url, "worker")])
        assert not r.pool.workers[url].healthy
        assert not r.pool.workers[late.url].healthy
        for _ in range(100):  # the probe, not the 60 s scrape, brings the live one in
            if r.pool.workers[late.url].healthy:
                break
            await asyncio.sleep(0.02)
        assert r.pool.workers[late.url].healthy
        assert not r.pool.workers[url].healthy
    finally:
        server.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_garbage_from_a_worker_is_retried_never_relayed(stream: bool, stubs: Start, router: Start) -> None:
    bad, good = await stubs("worker", "garbage"), await stubs("worker")
    r = await fast_router(router, [bad, good])
    results = await asyncio.gather(*(call(r.url, {"prompt": f"user {i}", "stream": stream}) for i in range(10)))
    for i in range(10, 40):  # make sure the garbage worker had its turn
        if bad.calls:
            break
        results.append(await call(r.url, {"prompt": f"user {i}", "stream": stream}))
    for status, raw in results:
        assert status == 200
        assert b"<html>" not in raw
        assert b"not json" not in raw
        got = events(raw) if stream else [orjson.loads(raw)]
        assert got
    assert bad.calls >= 1  # it was tried, and its answer thrown away


@pytest.mark.parametrize("stream", [False, True])
async def test_only_garbage_gives_a_clean_502(stream: bool, stubs: Start, router: Start) -> None:
    bad = await stubs("worker", "garbage")
    r = await fast_router(router, [bad])
    status, raw = await call(r.url, {"prompt": "hi", "stream": stream})
    assert status == 502
    assert orjson.loads(raw)["error"]["message"].startswith("every attempt failed")
    assert_no_address(raw, bad)


async def test_prefill_reply_without_kv_params_is_retried(stubs: Start, router: Start) -> None:
    nokv, prefill, decode = await stubs("prefill", "nokv"), await stubs("prefill"), await stubs("decode")
    r = await fast_router(router, [nokv, prefill, decode])
    results = []
    for i in range(30):  # until the policy has picked the bad prefill worker
        results.append(await call(r.url, {"prompt": f"{i} {LONG}"}))
        if nokv.calls:
            break
    assert nokv.calls == 1
    assert {s for s, _ in results} == {200}
    assert all("kv_transfer_params" in b for b in decode.bodies)


async def test_a_stream_silent_before_its_first_token_fails_over(stubs: Start, router: Start) -> None:
    stuck, good = await stubs("worker", "first_stall"), await stubs("worker")
    r = await fast_router(router, [stuck, good])
    results = []
    for i in range(20):  # until the policy has picked the stuck worker once
        start = time.monotonic()
        results.append(await call(r.url, {"prompt": f"user {i}", "stream": True}))
        assert time.monotonic() - start < 3
        if stuck.calls:
            break
    assert stuck.calls == 1
    for status, raw in results:
        assert status == 200
        assert events(raw)[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in events(raw))
    assert not r.pool.workers[stuck.url].healthy  # a timeout is a worker-level signal


async def test_a_stream_that_stalls_midway_ends_with_an_sse_error(stubs: Start, router: Start) -> None:
    """A frozen decode worker: the client gets what was sent, an error event and [DONE], not a hang."""
    frozen = await stubs("worker", "stall")
    r = await fast_router(router, [frozen])
    start = time.monotonic()
    status, raw = await call(r.url, {"prompt": "hi", "stream": True})
    assert time.monotonic() - start < 3
    assert status == 200
    got = events(raw)
    assert [e["choices"][0]["text"] for e in got[:2]] == ["t0", "t1"]
    assert got[2]["error"]["type"] == "upstream_error"
    assert "mid-stream" in got[2]["error"]["message"]
    assert got[3] == "[DONE]"
    assert_no_address(raw, frozen)
    assert r.sample("xpyd_router_errors_total", kind="decode_midstream") == 1


async def test_the_client_can_lower_the_deadline_not_raise_it(stubs: Start, router: Start) -> None:
    hung = await stubs("worker")
    r = await fast_router(router, [hung], request_timeout=0.6)
    hung.mode = "hang"  # after its probe
    start = time.monotonic()
    status, raw = await call(r.url, {"prompt": "hi"}, headers={"X-Request-Timeout": "0.2"})
    assert status == 504
    error = orjson.loads(raw)["error"]
    assert error["type"] == "timeout_error"
    assert "within its 0.2s deadline" in error["message"]  # the deadline applied, not the wall clock
    assert time.monotonic() - start > 0.15  # and not before it
    start = time.monotonic()
    status, raw = await call(r.url, {"prompt": "hi"}, headers={"X-Request-Timeout": "3600"})
    assert status == 504
    assert "within its 0.6s deadline" in orjson.loads(raw)["error"]["message"]  # the router's ceiling
    assert time.monotonic() - start > 0.5
    assert r.pool.workers[hung.url].healthy  # the client's deadline is not the worker's failure


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", ""])
async def test_a_bad_deadline_header_is_named(value: str, stubs: Start, router: Start) -> None:
    worker = await stubs("worker")
    r = await fast_router(router, [worker])
    status, raw = await call(r.url, {"prompt": "hi"}, headers={"X-Request-Timeout": value})
    assert status == 400
    assert orjson.loads(raw)["error"]["param"] == "X-Request-Timeout"
    assert worker.calls == 0


async def test_the_deadline_mid_stream_ends_the_stream_cleanly(stubs: Start, router: Start) -> None:
    slow = await stubs("worker", "stall")
    r = await fast_router(router, [slow], idle_timeout=5.0)
    status, raw = await call(r.url, {"prompt": "hi", "stream": True}, headers={"X-Request-Timeout": "0.4"})
    assert status == 200
    got = events(raw)
    assert got[2]["error"]["type"] == "timeout_error"
    assert got[-1] == "[DONE]"


async def test_models_has_a_bounded_timeout(stubs: Start, router: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "MODELS_TIMEOUT", 0.3)
    hung = await stubs("worker")
    r = await fast_router(router, [hung])
    hung.mode = "hang"
    start = time.monotonic()
    async with aiohttp.ClientSession() as s, s.get(r.url + "/v1/models") as resp:
        assert resp.status == 503
        raw = await resp.read()
    assert time.monotonic() - start < 5  # the hung worker never answers: only the 0.3 s bound ends it
    assert_no_address(raw, hung)
    good = await stubs("worker")
    r2 = await fast_router(router, [hung, good])
    async with aiohttp.ClientSession() as s, s.get(r2.url + "/v1/models") as resp:
        assert resp.status == 200
        assert (await resp.json())["data"][0]["id"] == "stub-model"


async def test_a_refused_connection_is_a_worker_failure(stubs: Start, router: Start) -> None:
    url, server = await silent_server()
    server.close()
    await server.wait_closed()
    good = await stubs("worker")
    r = await fast_router(router, [Stub(url, "worker"), good])
    r.pool.workers[url].healthy = True  # as if its probe had passed just before it died
    for i in range(30):  # until the policy has tried the dead worker
        status, _ = await call(r.url, {"prompt": f"user {i}"})
        assert status == 200
        if not r.pool.workers[url].healthy:
            break
    assert not r.pool.workers[url].healthy
    assert r.sample("xpyd_router_errors_total", kind="worker_failed") == 1
