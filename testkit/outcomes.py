"""What a client saw, counted: ok, failed cleanly, lost or hung; steady load that records each request.

A request is *ok* when it got a 200 and a complete answer (a JSON body, or a stream that ends with
`data: [DONE]` and no error event). It *failed cleanly* when it got an HTTP error with an
OpenAI-style `{"error": ...}` body, or a stream that ends with an SSE error event: the client knows
what happened and can retry. It is *lost* when the connection dropped, a stream was cut without an
error event, or a 200 carried a body that is not an answer. It *hung* when nothing ended it within
the client's own deadline. Lost and hung are the failures the fault suite must drive to zero.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

OK, CLEAN, LOST, HUNG = "ok", "failed cleanly", "lost", "hung"


def classify_body(status: int, body: bytes, streamed: bool) -> str:
    """The outcome of a finished HTTP exchange (status and the whole body read)."""
    if status != 200:
        try:
            return CLEAN if isinstance(json.loads(body).get("error"), dict) else LOST
        except (ValueError, AttributeError):
            return LOST
    if not streamed:
        try:
            doc = json.loads(body)
        except ValueError:
            return LOST
        return OK if isinstance(doc, dict) and doc.get("choices") else LOST
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    for event in events:
        if event.strip() == b"[DONE]":
            continue
        try:
            doc = json.loads(event)
        except ValueError:
            return LOST
        if isinstance(doc, dict) and "error" in doc:
            return CLEAN
    return OK if events and events[-1].strip() == b"[DONE]" else LOST


@dataclass
class Tally:
    """Outcomes of one case, and when each request started and ended (monotonic seconds)."""

    counts: dict[str, int] = field(default_factory=lambda: {OK: 0, CLEAN: 0, LOST: 0, HUNG: 0})
    spans: list[tuple[float, float, str]] = field(default_factory=list)

    def add(self, outcome: str, start: float, end: float) -> None:
        self.counts[outcome] += 1
        self.spans.append((start, end, outcome))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def in_flight_at(self, t: float) -> int:
        return sum(1 for start, end, _ in self.spans if start <= t < end)

    def recovery_s(self, fault_at: float) -> float | None:
        """Seconds from the fault until requests started after it succeed again without a failure."""
        after = sorted((s, o) for s, _, o in self.spans if s >= fault_at)
        last_bad = max((s for s, o in after if o != OK), default=None)
        if last_bad is None:
            return 0.0
        later_ok = [s for s, o in after if o == OK and s > last_bad]
        return round(later_ok[0] - fault_at, 1) if later_ok else None


@dataclass(frozen=True)
class Load:
    """Steady client traffic: `rate` requests/s for `seconds`, each with its own deadline."""

    url: str
    model: str
    rate: float = 4.0
    seconds: float = 20.0
    max_tokens: int = 32
    prompt_words: int = 200
    stream: bool = True
    deadline_s: float = 60.0
    headers: dict[str, str] = field(default_factory=dict)

    def body(self, i: int) -> dict[str, Any]:
        words = " ".join(f"w{(i * 7 + k) % 997}" for k in range(self.prompt_words))
        return {"model": self.model, "prompt": words, "max_tokens": self.max_tokens, "stream": self.stream}


async def one(session: aiohttp.ClientSession, load: Load, i: int, tally: Tally) -> None:
    start = time.monotonic()
    try:
        async with asyncio.timeout(load.deadline_s):
            async with session.post(f"{load.url}/v1/completions", json=load.body(i), headers=load.headers) as resp:
                body = await resp.read()
                outcome = classify_body(resp.status, body, load.stream)
    except TimeoutError:
        outcome = HUNG
    except (aiohttp.ClientError, ConnectionError):
        outcome = LOST
    tally.add(outcome, start, time.monotonic())


async def run_load(load: Load, during: Callable[[], Any] | None = None, at_s: float = 0.0) -> tuple[Tally, float]:
    """Send the load; call `during()` (a coroutine function) `at_s` seconds in. Returns the tally and the
    monotonic time the fault happened."""
    tally = Tally()
    fault_at = float("inf")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        fired = during is None
        i = 0
        while (now := time.monotonic()) - start < load.seconds:
            if not fired and now - start >= at_s:
                fired, fault_at = True, now
                assert during is not None
                await during()
            tasks.append(asyncio.create_task(one(session, load, i, tally)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / load.rate - time.monotonic()))
        if tasks:
            await asyncio.wait(tasks, timeout=load.deadline_s + 5)
        for task in tasks:
            task.cancel()
    return tally, fault_at


def row(case: str, tally: Tally, fault_at: float, note: str = "", recovery_text: str | None = None) -> str:
    """One line of the results table: case, in flight at the fault, lost, failed cleanly, hung, recovery
    (`recovery_text` replaces the computed recovery, for a case that measures its own)."""
    in_flight = tally.in_flight_at(fault_at) if fault_at != float("inf") else 0
    recovery = tally.recovery_s(fault_at) if fault_at != float("inf") else 0.0
    rec = "never" if recovery is None else f"{recovery:.1f} s"
    rec = rec if recovery_text is None else recovery_text
    c = tally.counts
    return f"| {case} | {tally.total} | {in_flight} | {c[OK]} | {c[LOST]} | {c[CLEAN]} | {c[HUNG]} | {rec} | {note} |"


HEADER = (
    "| case | requests | in flight at the fault | ok | lost | failed cleanly | hung | recovery | note |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
