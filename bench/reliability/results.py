"""What a fault case measured (Result), how hard it ran (Scale), and the steady mixed load it runs under."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from bench.reliability.stack import Stack
from bench.router.procs import MODEL, Proc
from testkit.outcomes import HUNG, LOST, Load, Tally, row, run_load

NO_FAULT = float("inf")
# Checks beyond lost == 0 and hung == 0, by the name a failure is reported under.
NO_CRASH = "no process crashed or logged a traceback"
DRAINED = "the draining worker exits within its --drain-timeout"
SSRF_400 = "every SSRF attempt answered 400"
SSRF_NO_CONNECTION = "the listeners got 0 connections"
SSRF_USERS_OK = "every other user's request succeeded"
LEAK_HELD = "the leaked prefills held KV (usage > 50%)"
LEAK_ROUTER_400 = "through the router every leak attempt answered 400"
LEAK_LARGE_OK = "a large request completes within the lease + 2 s"
LEAK_FREED = "KV usage back under 5% within the lease + 2 s"
FUZZ_PASSED = "the fuzzer ran and passed (exit 0: no 5xx, hang or crash)"
RAN = "the case ran"
PAIR_TRIPPED = "the faulty prefill/decode pair was taken out of pairing"
PAIR_BACK = "the pair carried a good handoff again after the fault ended"
PREFILL_HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


@dataclass(frozen=True)
class Scale:
    """How long and how hard each case runs."""

    seconds: float = 20.0  # steady load per case
    fault_at: float = 6.0  # seconds into the load
    rate: float = 8.0  # requests/s, half streamed and half not
    freeze_s: float = 5.0  # SIGSTOP to SIGCONT
    deadline_s: float = 30.0  # a client's own deadline: past it a request counts as hung
    speedup: float = 0.5  # emulator time: a 128-token answer takes ~1 s
    drain_s: float = 10.0  # --drain-timeout of the SIGTERM case's workers
    lease_s: float = 4.0  # KV lease of the leak case's emulator
    fuzz_requests: int = 10_000
    fuzz_budget_s: float = 100.0
    pair_fault_s: float = 5.0  # how long a prefill/decode pair's KV pulls fail (10a; 10b 1.6x as long)


FULL = Scale()
QUICK = Scale(seconds=8.0, fault_at=3.0, freeze_s=4.0, deadline_s=20.0, lease_s=3.0, fuzz_budget_s=40.0,
              pair_fault_s=4.0)  # fmt: skip
SHORT = Scale(seconds=4.0, fault_at=1.5, freeze_s=3.0, deadline_s=20.0, lease_s=2.0, pair_fault_s=8.0)  # the tests


@dataclass
class Result:
    """One case's outcome: its table row and the checks beyond lost == 0 and hung == 0."""

    case: str
    tally: Tally
    fault_at: float = NO_FAULT
    note: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    recovery_text: str | None = None
    facts: dict[str, float] = field(default_factory=dict)  # what the checks looked at, for tests

    def row(self) -> str:
        return row(self.case, self.tally, self.fault_at, self.note, self.recovery_text)

    def failures(self) -> list[str]:
        bad = [f"{self.tally.counts[k]} {k}" for k in (LOST, HUNG) if self.tally.counts[k]]
        return bad + [f"check failed: {name}" for name, ok in self.checks.items() if not ok]


def merge(*tallies: Tally) -> Tally:
    out = Tally()
    for tally in tallies:
        for start, end, outcome in tally.spans:
            out.add(outcome, start, end)
    return out


def describe(tally: Tally) -> str:
    parts = [f"{n} {k}" for k, n in tally.counts.items() if n]
    return ", ".join(parts) or "none"


def load(url: str, scale: Scale, stream: bool = True) -> Load:
    return Load(url, MODEL, rate=scale.rate / 2, seconds=scale.seconds, max_tokens=128, prompt_words=400,
                stream=stream, deadline_s=scale.deadline_s)  # fmt: skip


async def mixed(
    url: str, scale: Scale, fault: Callable[[], Awaitable[None]] | None, at_s: float
) -> tuple[Tally, float, str]:
    """Streamed and non-streamed load side by side; the fault fires from the streamed one."""
    base = load(url, scale)
    (streamed, fault_at), (plain, _) = await asyncio.gather(
        run_load(base, fault, at_s), run_load(replace(base, stream=False))
    )
    note = f"streamed: {describe(streamed)}; non-streamed: {describe(plain)}"
    return merge(streamed, plain), fault_at, note


def crash_check(st: Stack, killed: tuple[Proc, ...] = ()) -> tuple[dict[str, bool], str]:
    """The NO_CRASH check, and what was found for the note."""
    found = st.crashes(killed)
    return {NO_CRASH: not found}, "".join(f"; {problem}" for problem in found)


async def nothing() -> None:
    return None
