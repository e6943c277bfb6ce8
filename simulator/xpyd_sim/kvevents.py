"""Engine KV events in the simulator: what each worker's cache stored and evicted, delivered late.

vLLM publishes `BlockStored` / `BlockRemoved` events for every change of its prefix cache; a
router that subscribes keeps an index of what each worker really holds. Here every simulated
worker's `PrefixCache` reports its changes, and the router replicas' indexes receive them all
`delay_s` later (the publisher's batching plus the network), in the order they happened.

Each rank of a data-parallel replica publishes its own events (vLLM binds rank r's publisher on the
configured port + r). With rank targets (`per_rank`) they feed that rank's target, `URL#dpR`, as the
router subscribes; without, they all feed the replica's one target (its index then holds the union).

A worker with a CPU tier (KV offloading) also publishes that tier's changes, with medium CPU as vLLM's
offloading connector does: a block its GPU evicts is removed there (medium GPU) and stored on the CPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Literal

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import CPU, GPU
from xpyd_router.targets import target_name
from xpyd_sim.cache import KvEvent
from xpyd_sim.worker import Worker

IndexMode = Literal["own", "events", "events+own"]
INDEX_MODES: tuple[IndexMode, ...] = ("own", "events", "events+own")


class EventFedIndex(PrefixIndex):
    """A router replica's prefix index kept by engine KV events.

    Either way the routing path records its own decisions at once, a guess the events confirm or
    correct (removals drop what the worker evicted). `events`: the workers count as event-fed (the
    live router's mode): every replica sees the same caches, so the policy lets prefixes stick with
    several replicas. `events+own`: the same index treated as a replica's private one.
    """

    def __init__(self, own: bool) -> None:
        super().__init__()
        self.own = own

    def set_capacity(self, worker: str, blocks: int) -> None:
        super().set_capacity(worker, blocks)
        self.set_fed(worker, not self.own)

    def stored(self, worker: str, blocks: Sequence[int]) -> None:
        self.confirm(worker, blocks)


class EventBus:
    """Collects the workers' cache events and hands them to every replica index after `delay_s`."""

    def __init__(self, delay_s: float, per_rank: bool = True) -> None:
        if delay_s < 0:
            raise ValueError(f"KV event delay must be >= 0 s, got {delay_s}")
        self.delay_s = delay_s
        self.per_rank = per_rank  # a data-parallel rank's events feed its own target
        self._queue: deque[tuple[float, str, str, KvEvent]] = deque()  # (time, target, medium, event)
        self.indexes: list[EventFedIndex] = []
        self.delivered = 0

    def watch(self, workers: Iterable[Worker]) -> None:
        """Turn on event reporting for workers not watched yet."""
        for w in workers:
            for cache in w.caches:
                if cache.events is None:
                    cache.events = []
            for tier in w.tiers:
                if tier.events is None:
                    tier.events = []

    def send(self, w: Worker, now: float) -> float | None:
        """Queue the worker's new events; the time a delivery must be scheduled, when one must be."""
        was_empty = not self._queue
        sent = False
        ranked = self.per_rank and len(w.caches) > 1
        tiers = [(rank, GPU, cache.events) for rank, cache in enumerate(w.caches)]
        tiers += [(rank, CPU, tier.events) for rank, tier in enumerate(w.tiers)]
        for rank, medium, events in tiers:
            if not events:
                continue
            name = target_name(w.name, rank) if ranked else w.name
            for event in events:
                self._queue.append((now, name, medium, event))
            events.clear()
            sent = True
        if not sent:
            return None
        if self.delay_s == 0:
            return self.deliver(now)
        return now + self.delay_s if was_empty else None  # else the pending delivery reschedules

    def next_due(self) -> float | None:
        return self._queue[0][0] + self.delay_s if self._queue else None

    def deliver(self, now: float) -> float | None:
        """Apply every event at least `delay_s` old to every index, oldest first; the next due time."""
        queue = self._queue
        horizon = now - self.delay_s + 1e-12
        while queue and queue[0][0] <= horizon:
            _, name, medium, (stored, blocks) = queue.popleft()
            self.delivered += 1
            for index in self.indexes:
                if medium == CPU:
                    (index.offload if stored else index.unload)(name, blocks)
                elif stored:
                    index.stored(name, blocks)
                else:
                    index.discard(name, blocks)
        due = self.next_due()
        return None if due is None else max(due, now)
