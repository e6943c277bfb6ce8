"""The process-level fault cases: a fault under steady load against real `xpyd router` and `xpyd emulate`
processes on 127.0.0.1, each returning one row of bench/results/reliability.md.

Each case starts its own stack (one router in front of 1 prefill + 2 decode emulators in vLLM NixlConnector
mode unless it says otherwise), sends steady load, half streamed and half not (results.mixed), injects its
fault at a fixed time, and counts what every client saw. `Result.failures()` names what went wrong: a lost
or hung request, a crash, or a case-specific check (the SSRF and KV-leak reproductions' 400s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.reliability.fuzz_cases import fuzz_emulator, fuzz_router
from bench.reliability.pair_cases import pair_failing, pair_slow
from bench.reliability.repro_cases import LEAK_BLOCKS, kv_leak, ssrf
from bench.reliability.results import (
    DRAINED,
    FULL,
    NO_CRASH,
    NO_FAULT,
    QUICK,
    RAN,
    SHORT,
    Result,
    Scale,
    crash_check,
    mixed,
    nothing,
)
from bench.reliability.stack import stack
from bench.reliability.stubs import GarbageWorker, Listener, SilentWorker
from testkit.outcomes import Tally

# --- cases 1-3 and 8: a signal to one worker under load ------------------------------------------------


async def signalled(
    name: str, scale: Scale, logdir: Path, role: str, sig: signal.Signals, decode_env: dict[str, str] | None = None
) -> Result:
    async with stack(logdir, scale.speedup, decode_env=decode_env) as st:
        victim = (st.prefill if role == "prefill" else st.decode)[0]
        exited: list[float] = []

        def watch(since: float) -> None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                victim.popen.wait(scale.drain_s + 5)
                exited.append(time.monotonic() - since)

        watcher: list[asyncio.Future[None]] = []

        async def fault() -> None:
            os.kill(victim.popen.pid, sig)
            if sig == signal.SIGSTOP:
                asyncio.get_running_loop().call_later(scale.freeze_s, os.kill, victim.popen.pid, signal.SIGCONT)
            if sig == signal.SIGTERM:
                watcher.append(asyncio.ensure_future(asyncio.to_thread(watch, time.monotonic())))

        tally, fault_at, note = await mixed(st.url, scale, fault, scale.fault_at)
        checks, crashes = crash_check(st, (victim,) if sig in (signal.SIGKILL, signal.SIGTERM) else ())
        note += crashes
        if sig == signal.SIGTERM:
            await asyncio.wait(watcher)
            checks[DRAINED] = bool(exited and exited[0] <= scale.drain_s + 2)
            note += f"; it exited {exited[0]:.1f} s after SIGTERM" if exited else "; it did not exit"
    return Result(name, tally, fault_at, note, checks, facts={"exited after s": exited[0] if exited else -1.0})


async def decode_killed(scale: Scale, logdir: Path) -> Result:
    return await signalled("1. decode worker killed (SIGKILL)", scale, logdir, "decode", signal.SIGKILL)


async def prefill_killed(scale: Scale, logdir: Path) -> Result:
    return await signalled("2. prefill worker killed (SIGKILL)", scale, logdir, "prefill", signal.SIGKILL)


async def decode_frozen(scale: Scale, logdir: Path) -> Result:
    name = f"3. decode worker frozen (SIGSTOP, SIGCONT {scale.freeze_s:g} s later)"
    return await signalled(name, scale, logdir, "decode", signal.SIGSTOP)


async def decode_drained(scale: Scale, logdir: Path) -> Result:
    env = {"XPYD_DRAIN_TIMEOUT": f"{scale.drain_s:g}"}
    return await signalled("8. decode worker drained (SIGTERM)", scale, logdir, "decode", signal.SIGTERM, env)


# --- cases 4, 4b and 5: a bad worker in the decode pool from the start -----------------------------------


async def black_hole(scale: Scale, logdir: Path) -> Result:
    async with Listener(hold=True) as hole, stack(logdir, scale.speedup, extra_decode=[hole.url]) as st:
        tally, fault_at, note = await mixed(st.url, scale, nothing, 0.0)
        checks, crashes = crash_check(st)
    note += crashes + f"; the black hole got {hole.connections} connections, {hole.requests} of them completions"
    facts = {"connections": float(hole.connections), "completions": float(hole.requests)}
    return Result(
        "4. black-holed decode worker (accepts TCP, never answers)", tally, fault_at, note, checks, facts=facts
    )


async def silent(scale: Scale, logdir: Path) -> Result:
    """Streamed hops to it fail their first-byte budget and are retried; a non-streamed decode is silent until
    done, so only the router's --request-timeout ends one sent there (15 s here, 600 s by default)."""
    async with SilentWorker() as bad, stack(logdir, scale.speedup, extra_decode=[bad.url]) as st:
        tally, fault_at, note = await mixed(st.url, scale, nothing, 0.0)
        checks, crashes = crash_check(st)
    note += crashes + f"; it took {bad.served} decode hops"
    name = "4b. decode worker that passes /health but never answers a completion"
    return Result(name, tally, fault_at, note, checks, facts={"silent hops": float(bad.served)})


async def garbage(scale: Scale, logdir: Path) -> Result:
    async with GarbageWorker() as bad, stack(logdir, scale.speedup, extra_decode=[bad.url]) as st:
        tally, fault_at, note = await mixed(st.url, scale, nothing, 0.0)
        checks, crashes = crash_check(st)
    note += crashes + f"; it answered {bad.served} decode hops with garbage"
    facts = {"garbage hops": float(bad.served)}
    return Result("5. decode worker answering 200 with garbage", tally, fault_at, note, checks, facts=facts)


Case = Callable[[Scale, Path], Awaitable[Result]]
CASES: dict[str, Case] = {
    "decode-killed": decode_killed,
    "prefill-killed": prefill_killed,
    "decode-frozen": decode_frozen,
    "black-hole": black_hole,
    "silent": silent,
    "garbage": garbage,
    "ssrf": ssrf,
    "kv-leak": kv_leak,
    "decode-drained": decode_drained,
    "fuzz-router": fuzz_router,
    "fuzz-emulator": fuzz_emulator,
    "pair-failing": pair_failing,
    "pair-slow": pair_slow,
}


def case_limit(name: str, scale: Scale) -> float:
    """Seconds a case may take at most: its load, a client's deadline, start-up and teardown."""
    if name.startswith("fuzz"):
        return scale.fuzz_budget_s + 60
    if name.startswith("pair"):  # its load outlasts the pair's cool-off (pair_cases.py)
        return max(scale.seconds, scale.fault_at + 1.6 * scale.pair_fault_s + 15) + scale.deadline_s + 40
    return scale.seconds + scale.deadline_s + 40


async def run_case(name: str, scale: Scale, logdir: Path, limit: float | None = None) -> Result:
    """One case, bounded in time; an error becomes a failed row rather than a stopped suite."""
    try:
        async with asyncio.timeout(limit or case_limit(name, scale)):
            return await CASES[name](scale, logdir / name)
    except Exception as exc:  # reported in the table, never hidden
        return Result(name, Tally(), NO_FAULT, f"error: {exc!r}"[:300], {RAN: False}, "-")


async def run_all(
    scale: Scale, logdir: Path, budget_s: float, report: Callable[[Result], None] = lambda _: None
) -> list[Result]:
    """Every case in turn within `budget_s` seconds; a case that no longer fits is reported as not run."""
    end = time.monotonic() + budget_s
    results = []
    for name in CASES:
        left = end - time.monotonic()
        if left < min(case_limit(name, scale), 30.0):
            result = Result(name, Tally(), NO_FAULT, "not run: the suite's time budget was spent", {RAN: False}, "-")
        else:
            result = await run_case(name, scale, logdir, min(left, case_limit(name, scale)))
        report(result)
        results.append(result)
    return results


__all__ = ["CASES", "FULL", "LEAK_BLOCKS", "NO_CRASH", "QUICK", "SHORT", "Result", "Scale", "run_all", "run_case"]
