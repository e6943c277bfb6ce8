"""The router against real `xpyd emulate` workers: two hops, streaming, placement, faults, bad input."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from router_harness import MODEL, Emulator, Fleet, Router, free_port, worker_requests  # type: ignore[import-not-found]

from xpyd_api.engines import SGLANG_METRICS

pytestmark = pytest.mark.timeout(60)
LONG = "You are a helpful assistant. " * 80  # ~2300 chars: 9 router blocks, well past one KV block
StartRouter = Callable[..., Any]


@pytest.fixture(scope="module")
def shared() -> Iterator[list[Emulator]]:
    fleet = Fleet()
    try:
        prefill = [fleet.start("prefill", "node-a"), fleet.start("prefill", "node-b")]
        decode = [fleet.start("decode", "node-a"), fleet.start("decode", "node-c")]
        fleet.wait_ready()
        yield prefill + decode
    finally:
        for e in fleet.members:
            e.kill()


async def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if raw else None


async def test_two_hop_completion_through_prefill_and_decode(shared: list[Emulator], router: StartRouter) -> None:
    r: Router = await router(shared)
    async with aiohttp.ClientSession() as s:
        before = [await worker_requests(s, e.url) for e in shared]
        status, body = await post(r.url, {"model": MODEL, "prompt": LONG + "one", "max_tokens": 5})
        after = [await worker_requests(s, e.url) for e in shared]
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 5
    served = [e.role for e, b, a in zip(shared, before, after, strict=True) if a > b]
    assert sorted(served) == ["decode", "prefill"]
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="prefill") == 1
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="decode") == 1
    assert r.sample("xpyd_router_kv_handoffs_total") == 1


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"min_tokens": 4}, "/v1/completions"),  # a real vLLM answers the prefill hop 400 with it
        ({"min_tokens": 5, "logprobs": 1}, "/v1/completions"),
        ({"min_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}, "/v1/completions"),
    ],
)
async def test_decode_only_fields_pass_the_prefill_hop(
    shared: list[Emulator], router: StartRouter, extra: dict[str, Any], path: str
) -> None:
    r: Router = await router(shared)
    body = {"model": MODEL, "prompt": LONG + "min", "max_tokens": 5, **extra}
    async with aiohttp.ClientSession() as s, s.post(r.url + path, json=body) as resp:
        raw = await resp.read()
    assert resp.status == 200, raw
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="prefill") == 1


async def test_stream_is_passed_through_event_by_event(shared: list[Emulator], router: StartRouter) -> None:
    r: Router = await router(shared)
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 8, "stream": True}
    async with aiohttp.ClientSession() as s, s.post(r.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line async for line in resp.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]"
    chunks = [orjson.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert len(text) == 8 * 4  # 8 tokens of 4 characters each from the emulator
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="decode_first_byte") == 1


async def test_shared_prefix_goes_back_to_the_worker_that_cached_it(
    shared: list[Emulator], router: StartRouter
) -> None:
    r: Router = await router(shared)
    for suffix in ("first question", "second question", "third question"):
        status, _ = await post(r.url, {"model": MODEL, "prompt": LONG * 3 + suffix, "max_tokens": 2})
        assert status == 200
    assert r.sample("xpyd_router_decisions_total", role="prefill", reason="prefix") == 2
    assert r.sample("xpyd_router_prefix_hit_ratio") > 0.5


async def test_short_prompt_skips_prefill(shared: list[Emulator], router: StartRouter) -> None:
    r: Router = await router(shared, direct_below_blocks=8)
    status, body = await post(r.url, {"model": MODEL, "prompt": "Hi there", "max_tokens": 3})
    assert status == 200, body
    assert r.sample("xpyd_router_decisions_total", role="decode", reason="short-prompt") == 1
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="prefill") == 0
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="direct") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_one_hop_prompt_work_counts_until_done(shared: list[Emulator], router: StartRouter, stream: bool) -> None:
    workers = [Emulator(e.url, e.proc, "worker") for e in shared[2:]]
    r: Router = await router(workers)
    begun: list[int] = []
    prefilled: list[int] = []
    begin, done = r.pool.begin, r.pool.prefilled

    def count_begin(name: str, blocks: int = 0) -> None:
        begun.append(blocks)
        begin(name, blocks)

    def count_prefilled(name: str, blocks: int) -> None:
        prefilled.append(blocks)
        done(name, blocks)

    r.pool.begin = count_begin
    r.pool.prefilled = count_prefilled
    body = {"model": MODEL, "prompt": LONG * 3, "max_tokens": 4, "stream": stream}
    async with aiohttp.ClientSession() as s, s.post(r.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    assert begun and begun[0] > 0  # the uncached prompt blocks count as the worker's in-flight work
    assert prefilled == (begun[:1] if stream else [])  # released at the first token when it streams
    assert all(w.inflight == 0 and w.inflight_blocks == 0 for w in r.pool.workers.values())


async def test_colocated_workers_are_routed_in_one_hop(shared: list[Emulator], router: StartRouter) -> None:
    workers = [Emulator(e.url, e.proc, "worker") for e in shared[2:]]
    r: Router = await router(workers)
    for i in range(3):
        status, body = await post(r.url, {"model": MODEL, "prompt": f"{i} {LONG}", "max_tokens": 2})
        assert status == 200, body
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="direct") == 3
    assert r.sample("xpyd_router_hop_latency_seconds_count", hop="prefill") == 0


async def test_sglang_bootstrap_mode_sends_both_hops_at_once(fleet: Fleet, router: StartRouter) -> None:
    bootstrap = free_port("127.0.0.1")
    prefill = fleet.start("prefill", sglang_bootstrap=bootstrap)
    decode = fleet.start("decode", sglang_bootstrap=free_port("127.0.0.1"))
    fleet.wait_ready()
    r: Router = await router([prefill, decode], engine="sglang", bootstrap_port=bootstrap)
    async with aiohttp.ClientSession() as s:
        status, body = await post(r.url, {"model": MODEL, "prompt": LONG, "max_tokens": 4})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 4
        done = SGLANG_METRICS.e2e + "_count"  # SGLang's names (its flavour has no vLLM series)
        assert await worker_requests(s, prefill.url, done) == 1
        assert await worker_requests(s, decode.url, done) == 1


async def test_dead_prefill_worker_is_retried_on_another(
    shared: list[Emulator], fleet: Fleet, router: StartRouter
) -> None:
    doomed = fleet.start("prefill", "node-a")
    fleet.wait_ready()
    r: Router = await router([doomed, shared[1], shared[2]], scrape_interval=60)  # no scrape notices
    doomed.kill()
    await asyncio.sleep(0.3)  # the start-up scrape saw it die; pretend it has not noticed yet
    r.pool.workers[doomed.url].healthy = True
    for i in range(12):
        status, body = await post(r.url, {"model": MODEL, "prompt": f"{i} {LONG}", "max_tokens": 2})
        assert status == 200, body
        if r.sample("xpyd_router_retries_total"):
            break
    assert r.sample("xpyd_router_retries_total", hop="prefill") == 1
    assert r.sample("xpyd_router_errors_total", kind="worker_failed") == 1
    assert not r.pool.workers[doomed.url].healthy


async def test_decode_dying_mid_stream_ends_with_an_sse_error(
    shared: list[Emulator], fleet: Fleet, router: StartRouter
) -> None:
    slow = fleet.start("decode", "node-a", delay=True, speedup=0.2)
    fleet.wait_ready()
    r: Router = await router([shared[0], slow])
    body = {"model": MODEL, "prompt": LONG, "max_tokens": 4000, "stream": True}
    events: list[bytes] = []
    async with aiohttp.ClientSession() as s, s.post(r.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line.strip())
                if len(events) == 3:
                    slow.kill()
    error = orjson.loads(events[-2][6:])["error"]
    assert "mid-stream" in error["message"]
    assert events[-1] == b"data: [DONE]"
    assert r.sample("xpyd_router_errors_total", kind="decode_midstream") == 1


async def test_client_disconnect_cancels_the_upstream_request(
    shared: list[Emulator], fleet: Fleet, router: StartRouter
) -> None:
    slow = fleet.start("decode", delay=True, speedup=0.2)
    fleet.wait_ready()
    r: Router = await router([shared[0], slow])
    body = {"model": MODEL, "prompt": LONG, "max_tokens": 4000, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/completions", json=body) as resp:
            await resp.content.readline()
            assert await running(s, slow.url) == 1
            assert r.pool.workers[slow.url].inflight == 1
            resp.close()
        for _ in range(100):
            if r.pool.workers[slow.url].inflight == 0:
                break
            await asyncio.sleep(0.05)
    # The router dropped its upstream request (closing that connection) as soon as the client left.
    assert r.pool.workers[slow.url].inflight == 0
    assert r.sample("xpyd_router_errors_total", kind="client_disconnected") == 1


async def running(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:num_requests_running"))


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (b"{oops", 400, "not valid JSON"),
        (b'{"model": "m"}', 400, "'prompt' must be"),
        (b'{"prompt": "x", "stream": 1}', 400, "'stream' must be a boolean"),
        (b'{"prompt": "' + b"x" * 300_000 + b'"}', 413, "too large"),
    ],
)
async def test_bad_input_gets_openai_errors(
    shared: list[Emulator], router: StartRouter, payload: bytes, status: int, message: str
) -> None:
    r: Router = await router(shared, max_body_bytes=200_000)
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/completions", data=payload) as resp:
            assert resp.status == status
            assert message in (await resp.json())["error"]["message"]
        async with s.get(r.url + "/health") as resp:  # still serving
            assert resp.status == 200


async def test_no_ready_worker_gives_503(fleet: Fleet, router: StartRouter) -> None:
    gone = fleet.start("decode")
    fleet.wait_ready()
    gone.kill()
    r: Router = await router([gone])
    status, body = await post(r.url, {"model": MODEL, "prompt": "hello", "max_tokens": 2})
    assert status == 503
    assert body["error"]["type"] == "service_unavailable"
    assert "no ready decode worker" in body["error"]["message"]
    async with aiohttp.ClientSession() as s, s.get(r.url + "/health") as resp:
        assert resp.status == 503


async def test_models_health_and_metrics(shared: list[Emulator], router: StartRouter) -> None:
    r: Router = await router(shared)
    async with aiohttp.ClientSession() as s:
        async with s.get(r.url + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == MODEL
        async with s.get(r.url + "/health") as resp:
            assert (await resp.json())["ready"] == {"prefill": 2, "decode": 2, "worker": 0}
        await asyncio.sleep(0.5)  # one scrape
        async with s.get(r.url + "/metrics") as resp:
            text = await resp.text()
    assert 'xpyd_router_workers{deployment="test",role="decode",state="ready"} 2.0' in text
    assert r.pool.workers[shared[0].url].capacity_blocks > 0  # sized from vllm:cache_config_info


async def test_a_frozen_decode_worker_ends_the_stream_instead_of_hanging(fleet: Fleet, router: StartRouter) -> None:
    """SIGSTOP mid-stream: the idle timeout turns the silence into an SSE error event, then [DONE]."""
    frozen = fleet.start("worker", delay=True, speedup=0.2)
    fleet.wait_ready()
    r: Router = await router([frozen], scrape_interval=60, idle_timeout=0.5)
    body = {"model": MODEL, "prompt": LONG, "max_tokens": 4000, "stream": True}
    events: list[bytes] = []
    start = 0.0
    async with aiohttp.ClientSession() as s, s.post(r.url + "/v1/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line.strip())
                if len(events) == 2:
                    frozen.proc.send_signal(signal.SIGSTOP)
                    start = asyncio.get_running_loop().time()
    assert asyncio.get_running_loop().time() - start < 5
    assert orjson.loads(events[-2][6:])["error"]["type"] == "upstream_error"
    assert events[-1] == b"data: [DONE]"
    assert not r.pool.workers[frozen.url].healthy
