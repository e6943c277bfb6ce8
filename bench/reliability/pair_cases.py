"""Case 10, self-healing pairs: one prefill/decode pair's KV handoffs fail (10a) or are slow (10b) for a while under
load, and the router must cool that pair off, reroute its requests, and pair it again once the fault is over.

Two prefill and two decode emulators behind one router on 127.0.0.1. decode0 is started with the emulator's
KV-pull fault (`--fault-kv-pull-*`, as env) naming prefill0's side channel, armed for SIGUSR1: the case sends the
signal `fault_at` seconds into the load and the fault lasts `pair_fault_s`. A poller reads the router's /metrics
every 0.2 s. The pair's recovery is from the fault's end until the pair carries a good handoff again (its KV
tokens handed over rise, with `--kv-bytes-per-token 1`; for 10b a streamed handoff under --handoff-slow-seconds,
the only ones the router times): the rest of its cool-off plus the time until the policy picks it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
from bench.reliability.results import PAIR_BACK, PAIR_TRIPPED, Result, Scale, crash_check, mixed
from bench.reliability.stack import HOST, Stack, emulator, ready, router, stop
from bench.router.procs import Procs, free_port
from prometheus_client.parser import text_string_to_metric_families

from xpyd_router.pairs import PairLimits

POLL_S = 0.2
SLOW_S = 1.0  # 10b's --handoff-slow-seconds: a bucket bound of the handoff histogram, far above a loopback handoff
DELAY_S = 1.5  # 10b's injected delay per pull: over SLOW_S, under the first-byte budget (3 s) with the decode
REROUTED = ("pair_cooling", "pair_retry")  # decode decisions that moved a request to another pair
DIRECT = ("pair_cooling_direct", "pair_retry_direct")  # ... or to its decode worker alone


@dataclass
class Sample:
    """What one scrape of the router said about the faulty pair."""

    at: float
    trips: float = 0.0  # xpyd_router_pair_trips_total, both reasons
    good: float = 0.0  # its good handoffs: KV tokens handed over (10b: streamed handoffs under SLOW_S)
    cooling: float = 0.0  # xpyd_router_pairs_cooling_off (only this pair can cool off: 0 once it is back)
    decisions: dict[str, float] = field(default_factory=dict)
    failures: float = 0.0  # xpyd_router_handoff_failures_total{stage="error"} of the pair
    retries: float = 0.0  # xpyd_router_handoff_retries_total of the pair


def read(text: str, pair: tuple[str, str], slow: bool, at: float) -> Sample:
    s = Sample(at)
    for family in text_string_to_metric_families(text):
        for m in family.samples:
            mine = (m.labels.get("prefill"), m.labels.get("decode")) == pair
            if m.name == "xpyd_router_pair_trips_total" and mine:
                s.trips += m.value
            elif m.name == "xpyd_router_handoff_bytes_total" and mine and not slow:
                s.good = m.value
            elif m.name == "xpyd_router_handoff_latency_seconds_bucket" and mine and slow:
                s.good = m.value if float(m.labels["le"]) == SLOW_S else s.good
            elif m.name == "xpyd_router_pairs_cooling_off":
                s.cooling = m.value
            elif m.name == "xpyd_router_decisions_total" and m.labels.get("role") == "decode":
                s.decisions[m.labels["reason"]] = m.value
            elif m.name == "xpyd_router_handoff_failures_total" and mine and m.labels.get("stage") == "error":
                s.failures = m.value
            elif m.name == "xpyd_router_handoff_retries_total" and mine:
                s.retries = m.value
    return s


async def poll(url: str, pair: tuple[str, str], slow: bool, out: list[Sample], stop_at: asyncio.Event) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while not stop_at.is_set():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url + "/metrics") as resp:
                    text = await resp.text()
                out.append(read(text, pair, slow, time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_at.wait(), POLL_S)


def pair_recovery(samples: list[Sample], fault_end: float) -> float | None:
    """Seconds from the fault's end until the poll that first saw the pair's good-handoff count rise past
    what it was at the fault's end (None: it never did within the load)."""
    before = [s.good for s in samples if s.at <= fault_end]
    base = before[-1] if before else 0.0
    back = next((s.at for s in samples if s.at > fault_end and s.good > base), None)
    return None if back is None else back - fault_end


def seconds(value: float | None) -> float:
    return -1.0 if value is None else value


@contextlib.asynccontextmanager
async def two_by_two(logdir: Path, speedup: float, fault_env: dict[str, str], slow: bool) -> AsyncIterator[Stack]:
    """2 prefill + 2 decode emulators and a router; decode0 gets `fault_env` naming prefill0's side channel."""
    await asyncio.to_thread(logdir.mkdir, parents=True, exist_ok=True)
    st = Stack(Procs(logdir))
    try:
        side = free_port(HOST)
        st.prefill = [emulator(st.procs, "prefill0", speedup, env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}),
                      emulator(st.procs, "prefill1", speedup)]  # fmt: skip
        faulty = {k: v.replace("PREFILL0", f"{HOST}:{side}") for k, v in fault_env.items()}
        st.decode = [emulator(st.procs, "decode0", speedup, env=faulty), emulator(st.procs, "decode1", speedup)]
        await ready(*st.prefill, *st.decode)
        flags = ("--kv-bytes-per-token", "1", *(("--handoff-slow-seconds", f"{SLOW_S:g}") if slow else ()))
        st.router = router(st.procs, [p.url for p in st.prefill], [p.url for p in st.decode], flags)
        await ready(st.router)
        yield st
    finally:
        await asyncio.to_thread(stop, st.procs)


async def pair_fault(name: str, scale: Scale, logdir: Path, slow: bool) -> Result:
    fault_s = scale.pair_fault_s * (1.6 if slow else 1.0)  # slow trips need 3 streamed handoffs: give it longer
    cool_off = PairLimits().cool_off
    env = {"XPYD_FAULT_KV_PULL_AT": "SIGUSR1", "XPYD_FAULT_KV_PULL_FOR": f"{fault_s:g}"}
    env |= (
        {"XPYD_FAULT_KV_PULL_SLOW_FROM": "PREFILL0", "XPYD_FAULT_KV_PULL_DELAY": f"{DELAY_S:g}"}
        if slow
        else {"XPYD_FAULT_KV_PULL_FAIL_FROM": "PREFILL0"}
    )
    # Load past the latest the pair can be back: a trip at the fault's end, its cool-off, and time to be picked.
    load = replace(scale, seconds=max(scale.seconds, scale.fault_at + fault_s + cool_off + 5))
    async with two_by_two(logdir, scale.speedup, env, slow) as st:
        victim = st.decode[0]
        pair = (st.prefill[0].url, victim.url)
        samples: list[Sample] = []
        done = asyncio.Event()
        poller = asyncio.create_task(poll(st.url, pair, slow, samples, done))

        async def fault() -> None:
            os.kill(victim.popen.pid, signal.SIGUSR1)

        try:
            tally, fault_at, note = await mixed(st.url, load, fault, scale.fault_at)
        finally:
            done.set()
            await poller
        checks, crashes = crash_check(st)
    last = samples[-1] if samples else Sample(0.0)
    fault_end = fault_at + fault_s
    recovery = pair_recovery(samples, fault_end)
    tripped = next((s.at - fault_at for s in samples if s.trips > 0), None)
    paired = (
        None
        if tripped is None
        else next((s.at - fault_end for s in samples if s.at > fault_at + tripped and not s.cooling), None)
    )
    rerouted = sum(last.decisions.get(r, 0.0) for r in REROUTED)
    direct = sum(last.decisions.get(r, 0.0) for r in DIRECT)
    checks |= {PAIR_TRIPPED: last.trips >= 1, PAIR_BACK: recovery is not None}
    facts = {"trips": last.trips, "tripped after s": seconds(tripped), "paired after end s": seconds(paired),
             "recovery s": seconds(recovery), "rerouted": rerouted, "direct": direct,
             "pair failures": last.failures, "pair retries": last.retries, "fault s": fault_s}  # fmt: skip
    what = f"slow by {DELAY_S:g} s (router --handoff-slow-seconds {SLOW_S:g})" if slow else "failing (HTTP 500)"
    note += (
        f"; prefill0 -> decode0 {what} for {fault_s:g} s: tripped {last.trips:g}x "
        f"({'never' if tripped is None else f'{tripped:.1f} s after the fault began'}), "
        f"{last.failures:g} failed handoffs retried elsewhere, {rerouted:g} requests rerouted to another pair, "
        f"{direct:g} decode-only; back in pairing {'never' if paired is None else f'{paired:.1f} s'} after the "
        f"fault's end; recovery = fault end to the pair's next good handoff{crashes}"
    )
    rec = "never" if recovery is None else f"{recovery:.1f} s (pair)"
    return Result(name, tally, fault_at, note, checks, rec, facts)


async def pair_failing(scale: Scale, logdir: Path) -> Result:
    return await pair_fault("10a. KV handoffs of one prefill/decode pair failing for a while", scale, logdir, False)


async def pair_slow(scale: Scale, logdir: Path) -> Result:
    return await pair_fault("10b. KV handoffs of one prefill/decode pair slow for a while", scale, logdir, True)
