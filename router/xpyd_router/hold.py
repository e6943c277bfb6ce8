"""The waiting room for requests that arrive while no worker can take them: a pool scaled to zero
(`minReplicas: 0`) or still starting.

Without it such a request gets 503 at once, and nothing records the demand that should wake the
pools. With it (`--hold-seconds S`) the request waits, up to S seconds and within its own deadline,
until a worker is ready, then goes on as any other; at most `--hold-max` wait at once (the next one
gets 503 at once). A request that waits in vain gets 503 with `Retry-After`. The waiting count is a
gauge (`xpyd_router_held_requests`): the autoscaler wakes a pool at zero when it is above zero.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Final, Literal, TypeVar

from xpyd_router.model import NoWorker

T = TypeVar("T")
Outcome = Literal["served", "timeout", "full"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("served", "timeout", "full")
POLL_SECONDS: Final = 0.25  # how often a held request asks again whether a worker is ready


class HoldRefused(Exception):
    """The request was not served from the waiting room: it was full, or no worker came in time."""

    def __init__(self, outcome: Outcome, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retry_after = retry_after  # seconds for the client's Retry-After


class ColdHold:
    """At most `limit` requests waiting up to `seconds` each for a worker (0 seconds: off)."""

    def __init__(self, seconds: float = 0.0, limit: int = 256, poll: float = POLL_SECONDS) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"hold seconds must be 0 or more, got {seconds}")
        if limit < 1:
            raise ValueError(f"hold limit must be at least 1, got {limit}")
        if not poll > 0:
            raise ValueError(f"hold poll interval must be positive, got {poll}")
        self.seconds = seconds
        self.limit = limit
        self.poll = poll
        self.held = 0  # requests waiting now
        self.counts: dict[str, int] = dict.fromkeys(OUTCOMES, 0)  # requests by Outcome
        self.on_served: Callable[[float], None] | None = None  # told how long each served request waited

    @property
    def enabled(self) -> bool:
        return self.seconds > 0

    def retry_after(self) -> int:
        """What a refused client is told to wait: the hold, at least one second."""
        return max(1, math.ceil(self.seconds))

    async def wait(self, attempt: Callable[[], T], budget: float = math.inf) -> T:
        """`attempt()` again every `poll` seconds until it stops raising NoWorker; HoldRefused when the
        room is full or the hold (or the request's `budget`, whichever is less) runs out."""
        if self.held >= self.limit:
            self.counts["full"] += 1
            raise HoldRefused("full", f"{self.held} requests already wait for a worker to start", self.retry_after())
        limit = min(self.seconds, budget)
        start = time.monotonic()
        self.held += 1
        try:
            while True:
                try:
                    got = attempt()
                except NoWorker as exc:
                    left = limit - (time.monotonic() - start)
                    if left <= 0:
                        self.counts["timeout"] += 1
                        message = f"no worker became ready within {limit:g}s ({exc})"
                        raise HoldRefused("timeout", message, self.retry_after()) from None
                    await asyncio.sleep(min(self.poll, left))
                    continue
                self.counts["served"] += 1
                if self.on_served is not None:
                    self.on_served(time.monotonic() - start)
                return got
        finally:
            self.held -= 1
