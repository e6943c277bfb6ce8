"""The KV block pool: how many blocks are pinned, and an LRU index of cached prefix blocks, per rank.

The index is a plain dict from chained block hash to None kept in recency order (a touch
re-inserts the key at the end) and trimmed from the front in batches of 1/64 of its capacity,
an approximate LRU that costs about 70 bytes a block (an OrderedDict costs twice that), so a
full index of 556k DeepSeek-V3 blocks stays well under 100 MB RSS. Pinned blocks (running
requests, leased prefill results) count against the pool; cached ones are evictable.

A vLLM data-parallel replica of D ranks runs D EngineCores, each with its own KV cache and prefix
cache (vllm/v1/engine/core.py, one per rank): the pool then keeps D indexes and D pinned counts,
each rank holding `num_blocks // D` blocks, and a prompt cached on rank 3 does not hit on rank 5.
Every method takes the rank (default 0); with one rank the pool is the plain single-engine pool.

A prompt's blocks are touched tail first, as vLLM frees a request's blocks in reverse order:
the LRU end then holds the tails of old prompts, so eviction shortens a cached prefix instead
of cutting its head (which would leave the rest unreachable). With events recorded, every change
is kept per rank as vLLM's KV events report it: ("stored", hashes, parent, token ids[,
cache salt]) for the blocks a prompt adds past its cached prefix, ("removed", hashes) per evicted block, ("cleared",).

A CPU tier (`cpu_blocks` per rank > 0: vLLM's native KV offloading, `--kv-offloading-size`) keeps
blocks in host memory the way vLLM's OffloadingConnector does: every block the GPU caches is also
copied to the tier (its events: ("offloaded", hashes) once stored there), the tier is an LRU of its
own that drops its oldest blocks when full (("unloaded", hashes)), and a block the GPU evicts stays
on the CPU while the tier has room. A prompt's run of blocks on the CPU after its GPU-cached prefix
(`reload`) is loaded back instead of recomputed.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

KvEvent = tuple[Any, ...]
MAX_SALTS = 1 << 16  # salted prompts remembered (by first block) for their stored events


class BlockPool:
    """Block accounting for one engine (or one per data-parallel rank): pinned blocks plus LRU indexes."""

    __slots__ = ("_batch", "_cpu", "_events", "_indexes", "_pinned", "_salts", "block_size", "cpu_blocks",
                 "enabled", "evictions", "num_blocks", "rank_blocks", "ranks")  # fmt: skip

    def __init__(
        self, num_blocks: int, block_size: int, enabled: bool = True, ranks: int = 1, cpu_blocks: int = 0
    ) -> None:
        self.ranks = max(1, ranks)
        self.num_blocks = max(self.ranks, num_blocks)  # the whole replica's
        self.rank_blocks = self.num_blocks // self.ranks  # one rank's KV cache
        self.block_size = block_size
        self.enabled = enabled
        self.evictions = 0
        self._pinned = [0] * self.ranks
        self._events: list[list[KvEvent]] | None = None  # per rank, when KV events are published
        self._batch = max(1, self.rank_blocks // 64)
        self._indexes: list[dict[int, None]] = [{} for _ in range(self.ranks)]
        self._salts: dict[int, str] = {}  # first block hash of a salted prompt -> its cache_salt
        self.cpu_blocks = max(0, cpu_blocks) if enabled else 0  # one rank's CPU tier (0: none)
        self._cpu: list[dict[int, None]] = [{} for _ in range(self.ranks)] if self.cpu_blocks else []

    def __len__(self) -> int:
        return sum(map(len, self._indexes))

    def cached(self, rank: int) -> int:
        """Blocks in one rank's prefix index."""
        return len(self._indexes[rank])

    @property
    def events(self) -> list[KvEvent] | None:
        """Rank 0's recorded events (a list when KV events are published); set [] to start recording."""
        return None if self._events is None else self._events[0]

    @events.setter
    def events(self, value: list[KvEvent] | None) -> None:
        self._events = None if value is None else [value, *([] for _ in range(self.ranks - 1))]

    def record_events(self) -> None:
        """Start recording every rank's KV events."""
        self._events = [[] for _ in range(self.ranks)]

    @property
    def pinned(self) -> int:
        return sum(self._pinned)

    def pinned_on(self, rank: int) -> int:
        return self._pinned[rank]

    @property
    def free(self) -> int:
        return self.num_blocks - self.pinned

    @property
    def usage(self) -> float:
        """Share of the replica's blocks pinned (vllm:kv_cache_usage_perc, 0-1)."""
        return min(1.0, self.pinned / self.num_blocks)

    def rank_usage(self, rank: int) -> float:
        """Share of one rank's blocks pinned (its engine's vllm:kv_cache_usage_perc)."""
        return min(1.0, self._pinned[rank] / self.rank_blocks)

    def blocks_for(self, tokens: int) -> int:
        return (tokens + self.block_size - 1) // self.block_size

    def match(self, hashes: list[int], rank: int = 0) -> int:
        """Number of leading blocks of a prompt already cached on `rank`; touches them (most recent, head last)."""
        if not self.enabled:
            return 0
        index = self._indexes[rank]
        hits = 0
        for h in hashes:
            if h not in index:
                break
            hits += 1
        for h in reversed(hashes[:hits]):
            del index[h]
            index[h] = None
        return hits

    def offloaded(self, rank: int) -> int:
        """Blocks in one rank's CPU tier."""
        return len(self._cpu[rank]) if self._cpu else 0

    def reload(self, hashes: list[int], start: int, rank: int = 0) -> int:
        """How many of a prompt's blocks from `start` on (after its GPU-cached prefix) `rank`'s CPU tier
        holds, one after another: the run the engine loads back instead of recomputing; touches them."""
        if not self._cpu or start >= len(hashes):
            return 0
        tier = self._cpu[rank]
        n = start
        while n < len(hashes) and hashes[n] in tier:
            n += 1
        for h in reversed(hashes[start:n]):
            del tier[h]
            tier[h] = None
        return n - start

    def _offload(self, hashes: list[int], rank: int, events: list[KvEvent] | None) -> None:
        """Copy the GPU's cached blocks to the CPU tier (the connector stores what it does not hold yet),
        dropping the tier's least recently used when it is full."""
        tier = self._cpu[rank]
        new = [h for h in hashes if h not in tier]
        for h in reversed(hashes):
            if h in tier:
                del tier[h]
            tier[h] = None
        overflow = len(tier) - self.cpu_blocks
        victims = list(islice(tier, overflow)) if overflow > 0 else []
        for h in victims:
            del tier[h]
        if events is not None:  # a block stored and dropped in one step was never there for the router
            gone, fresh = set(victims), set(new)
            if kept := [h for h in new if h not in gone]:
                events.append(("offloaded", kept))
            if dropped := [h for h in victims if h not in fresh]:
                events.append(("unloaded", dropped))

    def insert(self, hashes: list[int], tokens: Any = None, rank: int = 0) -> None:
        """Record a computed prompt's blocks as cached on `rank`, evicting its least recently used.

        `tokens` (the prompt's token ids) only feeds the "stored" event."""
        if not self.enabled:
            return
        index = self._indexes[rank]
        events = None if self._events is None else self._events[rank]
        if events is not None:
            first = next((i for i, h in enumerate(hashes) if h not in index), len(hashes))
            if first < len(hashes):
                size = self.block_size
                ids = [] if tokens is None else tokens[first * size : len(hashes) * size]
                salt = self._salts.get(hashes[0])
                stored = ("stored", hashes[first:], hashes[first - 1] if first else None, ids)
                events.append((*stored, salt) if salt is not None else stored)
        for h in reversed(hashes):
            if h in index:
                del index[h]
            index[h] = None
        overflow = len(index) - self.rank_blocks
        if overflow > 0:
            victims = list(islice(index, max(overflow, min(self._batch, len(index)))))
            for h in victims:
                del index[h]
            self.evictions += len(victims)
            if events is not None:
                events.extend(("removed", [h]) for h in victims)
        if self._cpu:
            self._offload(hashes, rank, events)

    def salt(self, root: int, salt: str) -> None:
        """The prompt whose first block hashes to `root` was sent with `salt`: its stored events carry it."""
        salts = self._salts
        salts.pop(root, None)
        salts[root] = salt
        if len(salts) > MAX_SALTS:
            del salts[next(iter(salts))]

    def take_events(self, rank: int = 0) -> list[KvEvent]:
        """`rank`'s events recorded since the last call (empty when none or when events are off)."""
        if self._events is None:
            return []
        events = self._events[rank]
        if not events:
            return []
        self._events[rank] = []
        return events

    def try_pin(self, blocks: int, rank: int = 0) -> bool:
        """Pin `blocks` blocks on `rank` if it has them free."""
        if blocks > self.rank_blocks - self._pinned[rank]:
            return False
        self._pinned[rank] += blocks
        return True

    def pin(self, blocks: int, rank: int = 0) -> None:
        """Pin blocks unconditionally (zero-delay mode accounts a lease without scheduling)."""
        self._pinned[rank] += blocks

    def unpin(self, blocks: int, rank: int = 0) -> None:
        self._pinned[rank] = max(0, self._pinned[rank] - blocks)

    def reset(self) -> None:
        """Drop every rank's prefix index (vLLM's /reset_prefix_cache resets each engine's)."""
        for index in self._indexes:
            index.clear()
        for tier in self._cpu:  # vLLM's reset evicts the offloaded blocks too
            tier.clear()
        if self._events is not None:
            for events in self._events:
                events.append(("cleared",))
