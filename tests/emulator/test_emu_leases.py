"""KV leases on every path, exact gauges after aborts, 400 for what can never fit, 503 when wedged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from emu_harness import KV_CONFIG, make_config, serving  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families

from xpyd_emulator.engine import Sequence
from xpyd_emulator.worker import Worker

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFILL_HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def gauges(http: aiohttp.ClientSession, base: str) -> tuple[float, float, float]:
    """(running, waiting, kv usage) from /metrics."""
    async with http.get(base + "/metrics") as resp:
        text = await resp.text()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    return found[names[0]], found[names[1]], found[names[2]]


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, data=orjson.dumps(body)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_streamed_remote_decode_prefills_lease_and_release(http: aiohttp.ClientSession) -> None:
    # 64 blocks of 16 tokens; eight streamed prefill hops of 7 blocks each pin 56 of them.
    cfg = make_config("127.0.0.21", MODEL, "--kv-transfer-config", KV_CONFIG, "--num-gpu-blocks-override", "64",
                      kv_lease_seconds=0.6)  # fmt: skip
    worker = Worker(cfg)
    async with serving(worker) as base:
        for i in range(8):
            body = {"prompt": f"{i:03d}" + "abcd" * 100, "max_tokens": 1, "stream": True,
                    "kv_transfer_params": PREFILL_HOP}  # fmt: skip
            async with http.post(base + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.read()).endswith(b"data: [DONE]\n\n")
        assert len(worker.leases) == 8
        assert (await gauges(http, base))[2] >= 56 / 64
        big = {"prompt": "wxyz" * 600, "max_tokens": 10}  # 39 blocks: fits only once the leases expire
        status, doc = await asyncio.wait_for(post(http, base + "/v1/completions", big), 10)
        assert status == 200
        assert doc["usage"]["completion_tokens"] == 10
        for _ in range(100):
            if await gauges(http, base) == (0, 0, 0):
                break
            await asyncio.sleep(0.05)
        assert await gauges(http, base) == (0, 0, 0)
        assert worker.leases.expired == 8


async def test_never_fitting_request_is_refused_at_once(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.21", MODEL, "--num-gpu-blocks-override", "8", "--max-model-len", "100000")
    async with serving(Worker(cfg)) as base:
        status, doc = await asyncio.wait_for(post(http, base + "/v1/completions", {"prompt": "abcd" * 200}), 2)
        assert (status, doc["error"]["type"]) == (400, "BadRequestError")
        assert "maximum context length is 128" in doc["error"]["message"]


async def test_aborted_clients_leave_exact_gauges_and_no_pinned_blocks(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.22", MODEL, "--kv-transfer-config", KV_CONFIG, "--max-num-seqs", "1", speedup=1.0)
    async with serving(Worker(cfg)) as base:
        long = {"prompt": "hi", "max_tokens": 3000, "stream": True, "kv_transfer_params": PREFILL_HOP}
        streaming = await http.post(base + "/v1/completions", json=long)
        await streaming.content.readany()  # a token arrived: it runs
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.4)) as impatient:
            body = dict(long, stream=False)
            queued = [asyncio.create_task(impatient.post(base + "/v1/completions", json=body)) for _ in range(2)]
            await asyncio.sleep(0.2)
            running, waiting, usage = await gauges(http, base)
            assert (running, waiting, usage > 0) == (1, 2, True)
            for task in queued:
                with pytest.raises(TimeoutError):
                    await task  # mid-queue abort
        for _ in range(50):  # the server sees the closed connections within a few loop turns
            if (await gauges(http, base))[:2] == (1, 0):
                break
            await asyncio.sleep(0.02)
        assert (await gauges(http, base))[:2] == (1, 0)
        streaming.close()  # mid-stream abort
        for _ in range(50):
            if await gauges(http, base) == (0, 0, 0):
                break
            await asyncio.sleep(0.02)
        assert await gauges(http, base) == (0, 0, 0)


async def test_an_undelivered_lease_is_freed_at_once() -> None:
    worker = Worker(make_config("127.0.0.23", MODEL, "--kv-transfer-config", KV_CONFIG, zero_delay=True))
    seq = Sequence(40, [], 1, 0.0, hold=True, streamed=False)
    seq.on_done = lambda: worker._lease(seq)
    worker.engine.instant(seq, 0.0)
    assert (len(worker.leases), worker.pool.pinned) == (1, 3)
    worker.finish(seq, delivered=True)
    assert len(worker.leases) == 1  # the client has the block ids: the decode will pull them
    worker.finish(seq, delivered=False)
    assert (len(worker.leases), worker.pool.pinned) == (0, 0)


async def test_health_turns_503_when_the_engine_loop_stops(http: aiohttp.ClientSession) -> None:
    worker = Worker(make_config("127.0.0.24", MODEL, speedup=1.0))
    async with serving(worker) as base:
        async with http.get(base + "/health") as resp:
            assert resp.status == 200
        waiting = asyncio.create_task(post(http, base + "/v1/completions", {"prompt": "x", "max_tokens": 5000}))
        await asyncio.sleep(0.1)
        worker._tasks[0].cancel()  # the scheduler loop dies
        status, doc = await asyncio.wait_for(waiting, 5)
        assert (status, doc["error"]["code"]) == (500, 500)  # not a request waiting forever
        async with http.get(base + "/health") as resp:
            assert resp.status == 503
            assert "engine loop stopped" in (await resp.json())["error"]["message"]
        status, _ = await post(http, base + "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 503


def test_a_queue_that_never_moves_is_a_wedged_engine() -> None:
    worker = Worker(make_config("127.0.0.24", MODEL))
    engine = worker.engine
    engine.waiting.append(Sequence(10, [], 1, 0.0))
    engine.progress = 100.0
    assert not engine.stalled(100.0 + worker.wedge_seconds - 1, worker.wedge_seconds)
    assert engine.stalled(100.0 + worker.wedge_seconds + 1, worker.wedge_seconds)
    engine.waiting.clear()
    assert not engine.stalled(1e9, worker.wedge_seconds)
