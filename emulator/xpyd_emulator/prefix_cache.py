"""The KV block pool: how many blocks are pinned, and an LRU index of cached prefix blocks.

The index is a plain dict from chained block hash to None kept in recency order (a touch
re-inserts the key at the end) and trimmed from the front in batches of 1/64 of its capacity,
an approximate LRU that costs about 70 bytes a block (an OrderedDict costs twice that), so a
full index of 556k DeepSeek-V3 blocks stays well under 100 MB RSS. Pinned blocks (running
requests, leased prefill results) count against the pool; cached ones are evictable.

A prompt's blocks are touched tail first, as vLLM frees a request's blocks in reverse order:
the LRU end then holds the tails of old prompts, so eviction shortens a cached prefix instead
of cutting its head (which would leave the rest unreachable). With `events` set, every change
is recorded as vLLM's KV events report it: ("stored", hashes, parent, token ids) for the blocks
a prompt adds past its cached prefix, ("removed", hashes) per evicted block, ("cleared",).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

KvEvent = tuple[Any, ...]


class BlockPool:
    """Block accounting for one engine: pinned blocks plus an LRU prefix-cache index."""

    __slots__ = ("_batch", "_index", "block_size", "enabled", "events", "evictions", "num_blocks", "pinned")

    def __init__(self, num_blocks: int, block_size: int, enabled: bool = True) -> None:
        self.num_blocks = max(1, num_blocks)
        self.block_size = block_size
        self.enabled = enabled
        self.pinned = 0
        self.evictions = 0
        self.events: list[KvEvent] | None = None  # a list when KV events are published
        self._batch = max(1, self.num_blocks // 64)
        self._index: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._index)

    @property
    def free(self) -> int:
        return self.num_blocks - self.pinned

    @property
    def usage(self) -> float:
        """Share of blocks pinned (vllm:kv_cache_usage_perc, 0-1)."""
        return min(1.0, self.pinned / self.num_blocks)

    def blocks_for(self, tokens: int) -> int:
        return (tokens + self.block_size - 1) // self.block_size

    def match(self, hashes: list[int]) -> int:
        """Number of leading blocks of a prompt already cached; touches them (most recent, head last)."""
        if not self.enabled:
            return 0
        index = self._index
        hits = 0
        for h in hashes:
            if h not in index:
                break
            hits += 1
        for h in reversed(hashes[:hits]):
            del index[h]
            index[h] = None
        return hits

    def insert(self, hashes: list[int], tokens: Any = None) -> None:
        """Record a computed prompt's blocks as cached, evicting the least recently used.

        `tokens` (the prompt's token ids) only feeds the "stored" event."""
        if not self.enabled:
            return
        index = self._index
        if self.events is not None:
            first = next((i for i, h in enumerate(hashes) if h not in index), len(hashes))
            if first < len(hashes):
                size = self.block_size
                ids = [] if tokens is None else tokens[first * size : len(hashes) * size]
                self.events.append(("stored", hashes[first:], hashes[first - 1] if first else None, ids))
        for h in reversed(hashes):
            if h in index:
                del index[h]
            index[h] = None
        overflow = len(index) - self.num_blocks
        if overflow > 0:
            victims = list(islice(index, max(overflow, min(self._batch, len(index)))))
            for h in victims:
                del index[h]
            self.evictions += len(victims)
            if self.events is not None:
                self.events.extend(("removed", [h]) for h in victims)

    def take_events(self) -> list[KvEvent]:
        """The events recorded since the last call (empty when none or when events are off)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    def try_pin(self, blocks: int) -> bool:
        """Pin `blocks` blocks if the pool has them free."""
        if blocks > self.free:
            return False
        self.pinned += blocks
        return True

    def unpin(self, blocks: int) -> None:
        self.pinned = max(0, self.pinned - blocks)

    def reset(self) -> None:
        """Drop the whole prefix index (vLLM's /reset_prefix_cache)."""
        self._index.clear()
        if self.events is not None:
            self.events.append(("cleared",))
