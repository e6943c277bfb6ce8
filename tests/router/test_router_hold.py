"""The waiting room for requests no worker can take yet (a pool scaled to zero, or starting): they wait
for a worker within a bound, the waiting count is exported (it wakes the pools), and a request that
waits in vain, or finds the room full, gets an OpenAI-style 503 with Retry-After."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp
import pytest
from router_harness import Fleet  # type: ignore[import-not-found]  # tests/router is on sys.path

from xpyd_router.hold import ColdHold, HoldRefused
from xpyd_router.model import NoWorker
from xpyd_router.pool import WorkerSpec

BODY = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello there", "max_tokens": 4}


def _after(n: int) -> Any:
    """An attempt that finds no worker `n` times, then one."""
    calls = [0]

    def attempt() -> str:
        calls[0] += 1
        if calls[0] <= n:
            raise NoWorker("decode")
        return "plan"

    return attempt, calls


async def test_a_held_request_goes_on_once_a_worker_is_there() -> None:
    hold = ColdHold(5.0, poll=0.01)
    waits: list[float] = []
    hold.on_served = waits.append
    attempt, calls = _after(3)
    assert await hold.wait(attempt) == "plan"
    assert calls[0] == 4 and hold.held == 0 and hold.counts["served"] == 1 and len(waits) == 1


@pytest.mark.parametrize(("seconds", "budget", "limit_text"), [(0.05, math.inf, "0.05s"), (5.0, 0.05, "0.05s")])
async def test_a_request_that_waits_in_vain_is_refused_with_retry_after(
    seconds: float, budget: float, limit_text: str
) -> None:
    hold = ColdHold(seconds, poll=0.01)
    attempt, _ = _after(10**9)
    with pytest.raises(HoldRefused, match=f"within {limit_text}") as info:
        await hold.wait(attempt, budget)
    assert (info.value.outcome, info.value.retry_after) == ("timeout", math.ceil(seconds))
    assert hold.held == 0 and hold.counts == {"served": 0, "timeout": 1, "full": 0}


async def test_a_full_room_refuses_at_once() -> None:
    hold = ColdHold(5.0, limit=1, poll=0.01)
    attempt, _ = _after(10**9)
    first = asyncio.create_task(hold.wait(attempt))
    await asyncio.sleep(0.03)
    assert hold.held == 1
    with pytest.raises(HoldRefused, match="1 requests already wait") as info:
        await hold.wait(attempt)
    assert info.value.outcome == "full"
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert hold.held == 0  # a client gone while it waited leaves no count behind


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"seconds": -1.0}, "hold seconds"), ({"seconds": math.nan}, "hold seconds"), ({"limit": 0}, "hold limit"),
     ({"poll": 0.0}, "poll interval")],
)  # fmt: skip
def test_bad_hold_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ColdHold(**kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_router_with_no_workers_holds_lists_the_model_and_serves_when_one_starts(
    router: Any, fleet: Fleet
) -> None:
    r = await router([], hold_seconds=30.0, served_model="meta-llama/Llama-3.1-8B-Instruct")
    async with aiohttp.ClientSession() as s:
        async with s.get(r.url + "/v1/models") as resp:  # the pool is at zero: the model stays listed
            assert resp.status == 200
            assert [m["id"] for m in (await resp.json())["data"]] == ["meta-llama/Llama-3.1-8B-Instruct"]
        pending = asyncio.create_task(s.post(r.url + "/v1/completions", json=BODY))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if r.sample("xpyd_router_held_requests") == 1:
                break
        assert r.sample("xpyd_router_held_requests") == 1  # what wakes the pools
        worker = fleet.start("decode")
        fleet.wait_ready()
        r.pool.set_workers([WorkerSpec(worker.url, "decode")])  # discovery finds the new pod
        async with await pending as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["choices"]
    assert r.sample("xpyd_router_held_requests") == 0
    assert r.sample("xpyd_router_hold_outcomes_total", outcome="served") == 1
    assert r.sample("xpyd_router_hold_wait_seconds_count") == 1


async def test_a_router_whose_pool_stays_at_zero_answers_503_with_retry_after(router: Any) -> None:
    r = await router([], hold_seconds=0.3, hold_max=4)
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            err = (await resp.json())["error"]
            assert err["type"] == "service_unavailable" and "no worker became ready within 0.3s" in err["message"]
        async with s.get(r.url + "/v1/models") as resp:  # nothing listed it yet and no --served-model
            assert resp.status == 503
        async with s.get(r.url + "/health") as resp:  # ready: it takes the requests that wake the pools
            assert resp.status == 200 and (await resp.json())["status"] == "holding"
    assert r.sample("xpyd_router_hold_outcomes_total", outcome="timeout") == 1


async def test_without_a_hold_no_worker_is_503_at_once(router: Any) -> None:
    r = await router([])
    async with aiohttp.ClientSession() as s:
        async with s.post(r.url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 503 and "Retry-After" not in resp.headers
        async with s.get(r.url + "/health") as resp:
            assert resp.status == 503
