"""First handshakes warmed: one tiny handoff per prefill/decode pair when one of its workers becomes ready.

NIXL's first transfer between two engines runs its handshake (agent metadata, memory registration),
which can take seconds; without a warm-up the first client request over each new pair pays for it. So
when the pool learns a worker is up (its first passing probe and scrape, or its return after being
down), the router runs the engine's own handoff (xpyd_router.handoff: NIXL's two hops, SGLang's room)
for a one-token prompt over each pair the worker makes with the ready workers of the other role and
its engine revision. In the background, `concurrency` at a time, `timeout` seconds each; nothing is
counted as client traffic (no request, hop, pair or breaker series; the engines count it as theirs;
its own are xpyd_router_pair_warmups_total by outcome and ..._running) and a failure is one log line,
not a pair failure. `xpyd router --no-warm-pairs` turns it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from xpyd_http.messages import Answer, Reply
from xpyd_router.handoff import Handoff, HopFailed
from xpyd_router.http.replies import BadReply
from xpyd_router.http.upstream import Upstream, UpstreamError
from xpyd_router.metrics import RouterMetrics
from xpyd_router.pool import WorkerPool
from xpyd_router.targets import split_target

log = logging.getLogger("xpyd_router")
PATH = "/v1/completions"
PROMPT = "warm-up"


class _Legs:
    """The handoff's legs for a warm-up: straight to the workers, no accounting (handoff.base.Legs)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def _post(self, worker: str, payload: bytes) -> bytes:
        try:
            resp = await self.upstream.post(worker, PATH, payload, first_byte=False)
            try:
                data = await resp.read()
            finally:
                resp.close()
        except UpstreamError as exc:
            raise HopFailed("warm-up failed", f"{worker}: {exc}", worker, exc.worker_down) from None
        if not 200 <= resp.status < 300:
            raise HopFailed("warm-up failed", f"{worker} answered {resp.status}", worker, False)
        return data

    async def prefill(self, worker: str, payload: bytes, parse: Callable[[bytes], Any]) -> Any:
        data = await self._post(worker, payload)
        try:
            return parse(data)
        except BadReply as exc:
            raise HopFailed("warm-up failed", f"{worker}: {exc}", worker, False) from None

    async def decode(self, worker: str, payload: bytes) -> Answer:
        await self._post(worker, payload)
        return Reply(200)

    def blame(self, failed: HopFailed) -> None:
        log.info("pair warm-up: the prefill leg failed: %s", failed.detail)


class Warmup:
    """Warms the pairs of each worker the pool reports ready (`ready`, the pool's on_ready hook)."""

    def __init__(
        self,
        pool: WorkerPool,
        upstream: Upstream,
        session: aiohttp.ClientSession,
        handoff: Handoff,
        concurrency: int = 4,
        timeout: float = 30.0,
        metrics: RouterMetrics | None = None,
    ) -> None:
        self.pool, self.session, self.handoff, self.timeout = pool, session, handoff, timeout
        self.metrics = metrics
        self.legs = _Legs(upstream)
        self._slots = asyncio.Semaphore(concurrency)
        self._running: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.model: str | None = None  # the served model's id, from a worker's /v1/models
        self.warmed = 0  # pairs warmed (for tests and logs)

    def ready(self, name: str) -> None:
        """A worker just became ready: warm each pair it makes with the other role's ready workers."""
        worker = self.pool.workers.get(name)
        if worker is None or worker.role == "worker":
            return
        rev = worker.rev  # KV moves only between equal engine revisions ("" pairs with any)
        if worker.role == "prefill":
            pairs = [(name, d.name) for d in self.pool.ready("decode") if not rev or not d.rev or d.rev == rev]
        else:
            pairs = [(p.name, name) for p in self.pool.ready("prefill") if not rev or not p.rev or p.rev == rev]
        for pair in pairs:
            if pair in self._running:
                continue
            self._running.add(pair)
            task = asyncio.get_running_loop().create_task(self._warm(*pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _warm(self, prefill: str, decode: str) -> None:
        outcome = "done"
        if self.metrics is not None:
            self.metrics.pair_warmups_running.labels(self.metrics.deployment).inc()
        try:
            async with self._slots, asyncio.timeout(self.timeout):
                model = self.model or await self._model(prefill)
                if model is None:
                    outcome = "skipped"
                    log.info("pair warm-up %s -> %s skipped: no model listed at /v1/models", prefill, decode)
                    return
                body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "stream": False}
                await self.handoff.run(self.legs, body, prefill, decode)
                self.warmed += 1
                log.info("pair warm-up %s -> %s done", prefill, decode)
        except HopFailed as exc:
            outcome = "failed"
            log.info("pair warm-up %s -> %s failed: %s", prefill, decode, exc.detail)
        except TimeoutError:
            outcome = "timeout"
            log.info("pair warm-up %s -> %s timed out after %g s", prefill, decode, self.timeout)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._running.discard((prefill, decode))
            if self.metrics is not None:
                self.metrics.pair_warmups_running.labels(self.metrics.deployment).dec()
                self.metrics.pair_warmups.labels(self.metrics.deployment, outcome).inc()

    async def _model(self, worker: str) -> str | None:
        try:
            async with self.session.get(split_target(worker)[0] + "/v1/models") as resp:
                doc = orjson.loads(await resp.read()) if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return None
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        model = first.get("id") if isinstance(first, dict) else None
        self.model = model if isinstance(model, str) and model else None
        return self.model

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
