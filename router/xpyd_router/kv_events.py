"""Subscribing to every worker's engine KV events (ZMQ, as vLLM and SGLang publish them).

One SUB socket per worker reads [topic, seq, payload]; a batch is applied once, in seq order.
On joining, after a gap in seq, when seq goes backwards (the engine restarted: its cache is empty)
and after QUIET_SECONDS without a batch, the subscription asks the engine's replay socket (DEALER to
its ROUTER) for the batches it missed: it sends ["", start_seq] and reads ["", seq, payload] (newer
vLLM: ["", topic, seq, payload]) until seq -1. Workers are followed level-based from the pool every
second; a worker whose engine publishes nothing stays modelled in the index. A worker that is a
whole data-parallel replica (its engine picks the rank) names every rank's sockets: one subscription
per rank, each rank's view counted into the worker's one entry in the index (kv/replica_index.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
from collections.abc import Callable

import zmq
import zmq.asyncio

from xpyd_router.kv.block_keys import MAX_BLOCK_SIZE
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.replica_index import RankIndex
from xpyd_router.kv.wire import WireError, decode_batch
from xpyd_router.pool import WorkerPool
from xpyd_router.targets import split_endpoints, target_name

log = logging.getLogger("xpyd_router.kv_events")
EVENTS, REPLAY = "kv_events", "kv_replay"  # WorkerState.extra keys: tcp:// endpoints
REPLAY_TIMEOUT = 2.0  # seconds to wait for each replayed batch
SYNC_SECONDS = 1.0
QUIET_SECONDS = 5.0  # a stream this long without a batch asks the replay socket for anything missed
END_SEQ = -1


class Subscription:
    """One engine's event stream, applied to its EngineView in seq order."""

    def __init__(self, ctx: zmq.asyncio.Context, events: str, replay: str, topic: str, view: EngineView,
                 active: Callable[[], bool], replay_timeout: float = REPLAY_TIMEOUT,
                 quiet: float = QUIET_SECONDS) -> None:  # fmt: skip
        self.ctx, self.events, self.replay, self.topic = ctx, events, replay, topic
        self.view, self.active, self.replay_timeout, self.quiet = view, active, replay_timeout, quiet
        self.last: int | None = None  # seq of the last batch applied
        self.last_live: int | None = None  # seq of the last batch read on SUB
        self.bad = 0  # payloads that were not KV event batches

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        sub.connect(self.events)
        try:
            await self.catch_up(0)  # what the engine cached before we joined, as far as its buffer goes
            while True:
                if not await sub.poll(self.quiet * 1000):
                    # Quiet: batches published while the SUB was still joining (or dropped at the
                    # publisher's high-water mark) are not followed by a gap to notice, so ask.
                    await self.catch_up(0 if self.last is None else self.last + 1)
                    continue
                frames = await sub.recv_multipart()
                if len(frames) == 3 and len(frames[1]) == 8:
                    await self.on_live(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close(linger=0)

    async def on_live(self, seq: int, payload: bytes) -> None:
        if self.last_live is not None and seq <= self.last_live:  # seq went back: a new engine process
            log.info("%s: KV event seq went from %d to %d: engine restarted", self.view.worker, self.last_live, seq)
            self.view.reset()
            self.last = None
        self.last_live = seq
        if self.last is None and seq > 0:
            await self.catch_up(0)
        elif self.last is not None and seq > self.last + 1:
            await self.catch_up(self.last + 1)
        if self.last is None or seq > self.last:
            self.apply(seq, payload)

    def apply(self, seq: int, payload: bytes) -> None:
        self.last = seq
        if not self.active():
            return
        try:
            events = decode_batch(payload)
        except WireError as exc:
            self.bad += 1
            if self.bad == 1:
                log.warning("%s: KV event payload not understood (%s); skipping such batches", self.view.worker, exc)
            return
        if self.view.worker not in self.view.index.fed:
            log.info("%s: its engine's KV events now feed its prefix index (seq %d)", self.view.worker, seq)
        self.view.apply(events)

    async def catch_up(self, start: int) -> None:
        """Replay from `start` on (a fresh DEALER each time, so a late answer cannot be misread)."""
        if not self.replay:
            return
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                async with asyncio.timeout(self.replay_timeout):
                    frames = await dealer.recv_multipart()
                while frames and not frames[0]:
                    frames = frames[1:]
                if len(frames) not in (2, 3):
                    return
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ or not frames[-1]:
                    return
                if seq >= start and (self.last is None or seq > self.last):
                    self.apply(seq, frames[-1])
        except TimeoutError:
            log.debug("%s: no KV replay answer from %s", self.view.worker, self.replay)
        finally:
            dealer.close(linger=0)


class KvEventHub:
    """Keeps one subscription per worker whose pod (or flags) names a KV events endpoint."""

    def __init__(
        self,
        pool: WorkerPool,
        topic: str = "",
        replay_timeout: float = REPLAY_TIMEOUT,
        retune: Callable[[int], None] | None = None,
    ) -> None:
        self.pool, self.topic, self.replay_timeout = pool, topic, replay_timeout
        self.retune = retune  # re-derives what counts in blocks (the policy's knobs) for a new block size
        self.ctx = zmq.asyncio.Context()
        # By subscription: the worker's name, or a replica rank's target name (`URL#dpR`).
        self.subs: dict[str, tuple[tuple[str, str, str], Subscription, asyncio.Task[None]]] = {}
        self.views: dict[str, EngineView] = {}
        self.shared: dict[str, dict[int, int]] = {}  # per replica worker: key -> ranks holding it

    def adopt(self, block_size: int) -> bool:
        """An engine reports blocks of another size than the router keys by (vLLM picks 64 or 128 for
        MLA models on its own, SGLang's page size is its flag): key by the engines' size from now on,
        if no engine block was keyed yet (one size per router: a later, different one stays unmatched
        and counts in its view's `mismatched`). What was modelled under the old size is dropped."""
        if block_size == self.pool.keys.block_size or not 0 < block_size <= MAX_BLOCK_SIZE:
            return False
        if any(view.stats.stored for view in self.views.values()):
            return False
        log.warning(
            "engines report %d-token KV blocks, the router keyed %d: keying by %d from now on",
            block_size, self.pool.keys.block_size, block_size,
        )  # fmt: skip
        self.pool.keys.set_block_size(block_size)
        for view in self.views.values():
            view.block_size = block_size
        for name in self.pool.index.workers:
            self.pool.index.clear(name)
        if self.retune is not None:
            self.retune(block_size)
        return True

    def wanted(self) -> dict[str, tuple[str, str, str]]:
        """Subscription name -> (worker, events socket, replay socket), one per rank of a replica worker."""
        out: dict[str, tuple[str, str, str]] = {}
        for name, worker in self.pool.workers.items():
            events = split_endpoints(worker.extra.get(EVENTS, ""))
            replays = split_endpoints(worker.extra.get(REPLAY, ""))
            if len(events) == 1:
                out[name] = (name, events[0], replays[0] if replays else "")
                continue
            for rank, endpoint in enumerate(events):
                out[target_name(name, rank)] = (name, endpoint, replays[rank] if rank < len(replays) else "")
        return out

    def sync(self) -> None:
        """Subscribe to new workers, drop gone ones, restart a subscription that failed."""
        wanted = self.wanted()
        for key, (spec, _, task) in list(self.subs.items()):
            if wanted.get(key) != spec or task.done():
                task.cancel()
                del self.subs[key]
                view = self.views.pop(key, None)
                if view is not None and isinstance(view.index, RankIndex):
                    view.index.clear(view.worker)  # this rank's share goes; the other ranks' stays
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.warning("%s: KV event subscription failed: %r", key, task.exception())
        replicas = {spec[0] for key, spec in wanted.items() if key != spec[0]}
        for name in self.shared.keys() - replicas:
            del self.shared[name]
        for key, spec in wanted.items():
            if key in self.subs:
                continue
            name = spec[0]
            if key == name:
                view = EngineView(name, self.pool.index, self.pool.keys.block_size, self.adopt)
                if name in self.pool.index.fed:  # a new subscription rebuilds what the old one knew
                    view.reset()
            else:
                if name not in self.shared and name in self.pool.index.fed:  # what a lone view left
                    self.pool.index.clear(name)
                shared = self.shared.setdefault(name, {})
                view = EngineView(name, RankIndex(self.pool.index, shared), self.pool.keys.block_size, self.adopt)
            self.views[key] = view
            active = functools.partial(operator.contains, self.pool.workers, name)
            sub = Subscription(self.ctx, spec[1], spec[2], self.topic, view, active, self.replay_timeout)
            self.subs[key] = (spec, sub, asyncio.create_task(sub.run(), name=f"kv-events {key}"))

    async def run(self, _: WorkerPool | None = None, interval: float = SYNC_SECONDS) -> None:
        """The background job: follow the pool until cancelled, then close every socket."""
        try:
            while True:
                self.sync()
                await asyncio.sleep(interval)
        finally:
            await self.close()

    async def close(self) -> None:
        tasks = [task for _, _, task in self.subs.values()]
        self.subs.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.ctx.destroy(linger=0)
