"""Coalescing work queue: one reconcile per object at a time, requests merged, failures retried later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("xpyd.operator")
Key = tuple[str, str]  # (namespace, name)


def backoff(failures: int, base: float = 0.5, cap: float = 60.0) -> float:
    """Delay before retry number `failures` (1, 2, ...): doubling from base, capped."""
    return float(min(cap, base * 2 ** max(0, failures - 1)))


class WorkQueue:
    def __init__(
        self,
        worker: Callable[[str, str], Awaitable[object]],
        concurrency: int = 16,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
    ) -> None:
        self._worker = worker
        self._sem = asyncio.Semaphore(concurrency)
        self._base, self._cap = base_delay, max_delay
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def add(self, key: Key) -> None:
        """Ask for a reconcile of `key`; merged with one already waiting or running."""
        if key in self._running:
            self._dirty.add(key)
            return
        self._running.add(key)
        task = asyncio.get_running_loop().create_task(self._run(key), name=f"reconcile {key[0]}/{key[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)

    async def _run(self, key: Key) -> None:
        try:
            async with self._sem:
                while True:
                    self._dirty.discard(key)
                    try:
                        await self._worker(*key)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        n = self._failures[key] = self._failures.get(key, 0) + 1
                        delay = backoff(n, self._base, self._cap)
                        log.warning("reconcile %s/%s failed (%d), retry in %.1fs: %s", *key, n, delay, exc)
                        self._retry_later(key, delay)
                        return
                    self._failures.pop(key, None)
                    if key not in self._dirty:
                        return
        finally:
            self._running.discard(key)

    def _retry_later(self, key: Key, delay: float) -> None:
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def idle(self) -> bool:
        return not self._running and not self._timers

    async def join(self) -> None:
        """Wait until nothing is running (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
