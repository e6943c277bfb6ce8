"""The two reproductions: SSRF through client-sent kv_transfer_params, and KV pinned by prefills nobody pulls."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from bench.reliability.results import (
    LEAK_FREED,
    LEAK_HELD,
    LEAK_LARGE_OK,
    LEAK_ROUTER_400,
    PREFILL_HOP,
    SSRF_400,
    SSRF_NO_CONNECTION,
    SSRF_USERS_OK,
    Result,
    Scale,
    crash_check,
    merge,
    mixed,
    nothing,
)
from bench.reliability.stack import stack
from bench.reliability.stubs import Listener
from bench.router.procs import MODEL
from testkit.outcomes import HUNG, LOST, OK, Tally, classify_body

# --- case 6: SSRF through kv_transfer_params ------------------------------------------------------------


def ssrf_bodies(near: Listener, far: Listener) -> list[tuple[str, dict[str, Any]]]:
    """(target, body): protocol fields a client must not set, aiming the KV pull at our listeners."""

    def kv(url: str) -> dict[str, Any]:
        host, port = url[7:].rsplit(":", 1)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e",
                "remote_block_ids": [0, 1], "remote_host": host, "remote_port": int(port)}  # fmt: skip

    base = {"model": MODEL, "prompt": "exfiltrate " * 300, "max_tokens": 8}
    return [
        ("router", {**base, "kv_transfer_params": kv(near.url)}),
        ("router", {**base, "kv_transfer_params": kv(far.url), "stream": True}),
        ("router", {**base, "vllm_xargs": {"kv_transfer_params": kv(near.url)}}),
        ("router", {**base, "bootstrap_host": near.url[7:].rsplit(":", 1)[0], "bootstrap_room": 7}),
        ("decode", {**base, "kv_transfer_params": kv(far.url)}),  # straight at a worker: not one of its peers
        ("decode", {**base, "kv_transfer_params": kv(far.url), "stream": True}),
    ]


async def ssrf(scale: Scale, logdir: Path) -> Result:
    async with (
        Listener(hold=False) as near,
        Listener(hold=False, host="127.0.0.99") as far,
        stack(logdir, scale.speedup) as st,
        aiohttp.ClientSession() as http,
    ):
        bodies = ssrf_bodies(near, far)
        attacks = Tally()
        statuses: dict[str, list[int]] = {"router": [], "decode": []}

        async def attack(i: int) -> None:
            target, body = bodies[i % len(bodies)]
            url = (st.url if target == "router" else st.decode[0].url) + "/v1/completions"
            start = time.monotonic()
            try:
                async with asyncio.timeout(scale.deadline_s), http.post(url, data=orjson.dumps(body)) as resp:
                    data = await resp.read()
                    statuses[target].append(resp.status)
                    outcome = classify_body(resp.status, data, body.get("stream") is True)
            except TimeoutError:
                outcome = HUNG
            except aiohttp.ClientError:
                outcome = LOST
            attacks.add(outcome, start, time.monotonic())

        async def attack_all() -> None:
            count = max(len(bodies), int(scale.rate * scale.seconds / 2))
            for i in range(count):
                await attack(i)
                await asyncio.sleep(scale.seconds / count)

        (users, fault_at, note), _ = await asyncio.gather(mixed(st.url, scale, nothing, 0.0), attack_all())
        checks, crashes = crash_check(st)
    sent = sum(len(s) for s in statuses.values())
    refused = sum(s.count(400) for s in statuses.values())
    checks |= {
        SSRF_400: refused == sent == attacks.total,
        SSRF_NO_CONNECTION: near.connections + far.connections == 0,
        SSRF_USERS_OK: users.counts[OK] == users.total,
    }
    note = (f"{refused}/{attacks.total} attempts answered 400 (router {statuses['router'].count(400)}, worker "
            f"{statuses['decode'].count(400)}); listeners got {near.connections + far.connections} connections; "
            f"other users: {users.counts[OK]}/{users.total} ok ({note}){crashes}")  # fmt: skip
    facts = {"attempts": float(attacks.total), "answered 400": float(refused),
             "router 400": float(statuses["router"].count(400)), "worker 400": float(statuses["decode"].count(400)),
             "listener connections": float(near.connections + far.connections),
             "users": float(users.total), "users ok": float(users.counts[OK])}  # fmt: skip
    return Result("6. SSRF: client kv_transfer_params aim the KV pull at a listener", merge(users, attacks),
                  fault_at, note, checks, "-", facts)  # fmt: skip


# --- case 7: KV held by streamed do_remote_decode requests ----------------------------------------------

LEAK_BLOCKS = 256  # a small pool (16-token blocks): 10 leaked prefills pin most of it


async def gauge(http: aiohttp.ClientSession, base: str, name: str = "vllm:kv_cache_usage_perc") -> float:
    async with http.get(base + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def exchange(http: aiohttp.ClientSession, url: str, body: dict[str, Any], tally: Tally, deadline: float) -> int:
    start, status = time.monotonic(), 0
    try:
        async with asyncio.timeout(deadline), http.post(url + "/v1/completions", data=orjson.dumps(body)) as resp:
            status = resp.status
            outcome = classify_body(status, await resp.read(), body.get("stream") is True)
    except TimeoutError:
        outcome = HUNG
    except aiohttp.ClientError:
        outcome = LOST
    tally.add(outcome, start, time.monotonic())
    return status


async def kv_leak(scale: Scale, logdir: Path) -> Result:
    """Streamed prefills with do_remote_decode that no decode ever pulls pin KV until their lease expires."""
    env = {"XPYD_KV_LEASE_SECONDS": f"{scale.lease_s:g}"}
    flags = ("--num-gpu-blocks-override", str(LEAK_BLOCKS), "--max-model-len", str(LEAK_BLOCKS * 16))
    tally = Tally()
    async with (
        stack(logdir, scale.speedup, prefills=0, decodes=1, decode_env=env, decode_flags=flags) as st,
        aiohttp.ClientSession() as http,
    ):
        worker = st.decode[0].url
        leaks = [{"model": MODEL, "prompt": f"leak {i} " + "x" * 1400, "max_tokens": 1, "stream": True,
                  "kv_transfer_params": PREFILL_HOP} for i in range(10)]  # fmt: skip
        direct = await asyncio.gather(*(exchange(http, worker, b, tally, scale.deadline_s) for b in leaks))
        routed = await asyncio.gather(*(exchange(http, st.url, b, tally, scale.deadline_s) for b in leaks))
        fault_at = time.monotonic()
        peak = await gauge(http, worker)
        large = {"model": MODEL, "prompt": "large " * 2000, "max_tokens": 16}  # ~190 of the 256 blocks
        big_tally = Tally()
        await exchange(http, st.url, large, big_tally, scale.deadline_s)
        big_s = big_tally.spans[0][1] - fault_at
        back_s = None
        while (waited := time.monotonic() - fault_at) < scale.lease_s + 5:
            if await gauge(http, worker) < 0.05:
                back_s = waited
                break
            await asyncio.sleep(0.1)
        checks, crashes = crash_check(st)
    bound = scale.lease_s + 2
    checks |= {
        LEAK_HELD: peak > 0.5,
        LEAK_ROUTER_400: routed.count(400) == len(leaks),
        LEAK_LARGE_OK: big_tally.counts[OK] == 1 and big_s <= bound,
        LEAK_FREED: back_s is not None and back_s <= bound,
    }
    note = (f"{direct.count(200)}/{len(leaks)} streamed do_remote_decode prefills straight at the worker pinned "
            f"{peak:.0%} of its KV; the same through the router: {routed.count(400)}/{len(leaks)} answered 400; "
            f"a ~3,000-token request then completed in {big_s:.1f} s; lease {scale.lease_s:g} s{crashes}")  # fmt: skip
    recovery = "never" if back_s is None else f"{back_s:.1f} s (KV usage < 5%)"
    facts = {"leaks": float(len(leaks)), "router 400": float(routed.count(400)), "peak usage": peak,
             "large ok": float(big_tally.counts[OK]), "large after s": big_s,
             "freed after s": -1.0 if back_s is None else back_s, "lease s": scale.lease_s}  # fmt: skip
    return Result("7. KV leak: streamed do_remote_decode prefills nobody pulls", merge(tally, big_tally),
                  fault_at, note, checks, recovery, facts)  # fmt: skip
