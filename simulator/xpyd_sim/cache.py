"""A worker's prefix cache: chained block ids kept in LRU order within a capacity that can shrink,
and the host-memory tier (KV offloading) its evicted blocks move to."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

# One KV event as a vLLM engine publishes it: (True, blocks) stored, (False, blocks) removed.
KvEvent = tuple[bool, list[int]]


class CpuTier:
    """A replica's CPU KV tier: the blocks its GPU cache evicted, in LRU order within `capacity`.

    As vLLM's offloading (an LRU of host blocks) reports it, `events` gets (True, blocks) when blocks
    reach host memory and (False, blocks) when the tier evicts them (medium CPU on the wire). A block
    reloaded to the GPU stays here too, so its next GPU eviction costs no copy and reports nothing.
    """

    __slots__ = ("_blocks", "capacity", "events", "evictions")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"CPU tier capacity must be >= 0 blocks, got {capacity}")
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.evictions = 0
        self.events: list[KvEvent] | None = None

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def put(self, blocks: Sequence[int]) -> None:
        """Blocks the GPU evicted (oldest first) become the tier's most recent; the coldest beyond
        capacity go."""
        held = self._blocks
        new: list[int] = []
        for b in blocks:
            if b in held:
                held.move_to_end(b)
            else:
                held[b] = None
                new.append(b)
        if new and self.events is not None:
            self.events.append((True, new))
        excess = len(held) - self.capacity
        if excess > 0:
            gone = [held.popitem(last=False)[0] for _ in range(excess)]
            self.evictions += excess
            if self.events is not None:
                self.events.append((False, gone))

    def run(self, blocks: Sequence[int], start: int) -> int:
        """How many of the prompt's blocks from `start` on the tier holds, one after another; touches them."""
        held = self._blocks
        n = start
        while n < len(blocks) and blocks[n] in held:
            held.move_to_end(blocks[n])
            n += 1
        return n - start


class PrefixCache:
    """LRU set of block ids; a lookup counts the leading blocks of a prompt already present.

    With `events` set to a list, every change is appended to it as the engine's KV events would
    report it (blocks newly stored, blocks evicted); touches of cached blocks report nothing.
    """

    __slots__ = ("_blocks", "capacity", "events", "evictions", "spill")

    def __init__(self, capacity: int, spill: CpuTier | None = None) -> None:
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0 blocks, got {capacity}")
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.evictions = 0
        self.events: list[KvEvent] | None = None
        self.spill = spill  # the CPU tier evicted blocks move to (KV offloading); None: they are gone

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
        new: list[int] | None = [] if self.events is not None else None
        for b in reversed(blocks):
            if b in cached:
                cached.move_to_end(b)
            else:
                cached[b] = None
                if new is not None:
                    new.append(b)
        if new and self.events is not None:
            new.reverse()
            self.events.append((True, new))
        self.trim(self.capacity)

    def trim(self, limit: int) -> None:
        """Evict least recently used blocks until at most `limit` remain."""
        cached = self._blocks
        excess = len(cached) - max(limit, 0)
        if excess <= 0:
            return
        if self.events is not None or self.spill is not None:
            gone = [cached.popitem(last=False)[0] for _ in range(excess)]
            if self.events is not None:
                self.events.append((False, gone))
            if self.spill is not None:
                self.spill.put(gone)
        else:
            for _ in range(excess):
                cached.popitem(last=False)
        self.evictions += excess
