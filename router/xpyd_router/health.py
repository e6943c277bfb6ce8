"""Worker health: a /health probe before a worker's first request, then the /metrics scrape loop."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from prometheus_client import Gauge

from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import WORKER_ROLES
from xpyd_router.pool import WorkerPool
from xpyd_router.scrape import WorkerMetrics, parse_metrics
from xpyd_router.targets import split_target

NO_METRICS = WorkerMetrics()
PROBE_TIMEOUT = 2.0  # seconds for GET /health or /metrics
_ERRORS = (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError)


class HealthChecker:
    """Probes new and down workers on /health; scrapes the healthy ones' /metrics."""

    def __init__(self, session: aiohttp.ClientSession, pool: WorkerPool, timeout: float = PROBE_TIMEOUT) -> None:
        self.session = session
        self.pool = pool
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._tasks: set[asyncio.Task[None]] = set()

    async def probe(self, name: str) -> bool:
        try:
            async with self.session.get(name + "/health", timeout=self.timeout) as resp:
                await resp.read()
                return resp.status == 200
        except _ERRORS:
            return False

    async def scrape(self, name: str) -> WorkerMetrics | TimeoutError | None:
        """The worker's metrics; None when it refused or failed; the TimeoutError when it answered too late."""
        try:
            async with self.session.get(name + "/metrics", timeout=self.timeout) as resp:
                if resp.status == 404:  # SGLang without --enable-metrics serves none: up, no figures
                    return NO_METRICS
                return parse_metrics(await resp.text()) if resp.status == 200 else None
        except TimeoutError as exc:
            return exc
        except _ERRORS:
            return None

    async def check(self, *names: str) -> None:
        """The targets of one API server (itself, or its data-parallel ranks): one /health probe when
        any is down (or new) and may come back, one /metrics scrape for all; a down target must pass
        the probe before the metrics can bring it back (or their late answer: it is busy, not gone)."""
        workers = self.pool.workers
        names = tuple(n for n in names if n in workers)
        if not names:
            return
        base = split_target(names[0])[0]
        due = [n for n in names if workers[n].healthy]
        down = [n for n in names if not workers[n].healthy and not self.pool.held(n)]
        if down and await self.probe(base):
            due += down
        if not due:
            return
        metrics = await self.scrape(base)
        slow = isinstance(metrics, TimeoutError)
        for name in due:
            if slow and name in down:
                # a down target is due only once it passed the probe just now: alive, busy computing (an engine
                # under load answers /metrics late), so up without figures, which the next scrape brings
                self.pool.apply_metrics(name, NO_METRICS)
            else:
                self.pool.apply_metrics(name, None if isinstance(metrics, TimeoutError) else metrics, timed_out=slow)

    async def check_all(self) -> None:
        by_server: dict[str, list[str]] = {}
        for name in list(self.pool.workers):
            by_server.setdefault(split_target(name)[0], []).append(name)
        await asyncio.gather(*(self.check(*names) for names in by_server.values()))

    def check_soon(self, name: str) -> None:
        """For pool.on_added: probe a newly discovered worker now rather than at the next scrape."""
        task = asyncio.get_running_loop().create_task(self.check(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def publish(pool: WorkerPool, metrics: RouterMetrics) -> None:
    """The xpyd_router_workers gauges by role and state, and the ready workers per engine revision."""
    for role in WORKER_ROLES:
        members = [w for w in pool.workers.values() if w.role == role]
        ready = sum(1 for w in members if w.healthy and not w.draining)
        draining = sum(1 for w in members if w.draining)
        metrics.workers.labels(metrics.deployment, role, "ready").set(ready)
        metrics.workers.labels(metrics.deployment, role, "draining").set(draining)
        metrics.workers.labels(metrics.deployment, role, "unhealthy").set(len(members) - ready - draining)
    by_rev = revisions(pool)
    for rev, roles in by_rev.items():
        for side, n in roles.items():
            metrics.revision_workers.labels(metrics.deployment, rev, side).set(n)
    for labels in _label_sets(metrics.revision_workers):  # a revision no worker runs any more: its series go
        if labels[1] not in by_rev:
            metrics.revision_workers.remove(*labels)
    metrics.pairable.labels(metrics.deployment).set(sum(min(roles.values()) for roles in by_rev.values()))


def revisions(pool: WorkerPool) -> dict[str, dict[str, int]]:
    """Engine revision -> prefill and decode -> ready workers ("" is a static worker's: it pairs with any)."""
    out: dict[str, dict[str, int]] = {}
    for w in pool.workers.values():
        if w.role in ("prefill", "decode") and w.healthy and not w.draining:
            out.setdefault(w.rev, {"prefill": 0, "decode": 0})[w.role] += 1
    return out


def _label_sets(gauge: Gauge) -> list[tuple[str, ...]]:
    """The label values of the series a labelled gauge holds (prometheus_client keeps no public list)."""
    return [tuple(s.labels[k] for k in ("deployment", "revision", "role")) for m in gauge.collect() for s in m.samples]


async def health_loop(checker: HealthChecker, metrics: RouterMetrics, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        await checker.check_all()
        publish(checker.pool, metrics)
