"""A worker's prefix cache: chained block ids kept in LRU order within a capacity that can shrink."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU set of block ids; a lookup counts the leading blocks of a prompt already present."""

    __slots__ = ("_blocks", "capacity", "evictions")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 blocks, got {capacity}")
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, blocks: Sequence[int]) -> int:
        """How many leading blocks are cached; touches them so they stay warm."""
        cached = self._blocks
        n = 0
        for b in blocks:
            if b not in cached:
                break
            n += 1
        for i in range(n - 1, -1, -1):
            cached.move_to_end(blocks[i])
        return n

    def insert(self, blocks: Sequence[int]) -> None:
        """Record a prompt's blocks as most recently used, evicting the coldest beyond capacity.

        The head is touched last, so eviction takes a prompt's tail first and what stays is a prefix
        (vLLM frees a sequence's blocks in reverse order for the same reason).
        """
        cached = self._blocks
        for b in reversed(blocks):
            if b in cached:
                cached.move_to_end(b)
            else:
                cached[b] = None
        self.trim(self.capacity)

    def trim(self, limit: int) -> None:
        """Evict least recently used blocks until at most `limit` remain."""
        cached = self._blocks
        excess = len(cached) - max(limit, 0)
        for _ in range(excess):
            cached.popitem(last=False)
        if excess > 0:
            self.evictions += excess
