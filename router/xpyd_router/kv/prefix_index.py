"""Per-worker prefix caches: what each engine reported it holds (its KV events), or, for an engine
that reports nothing, a model of its cache from the requests routed to it, its capacity and vLLM's
eviction order.

Three writers fill it, and each entry keeps the name of the one that wrote it (`Source`): `record`,
the routes this router replica chose (`own`, a guess); `record_peer`, the routes another replica
chose and passed on (`peer`, its guess, loadshare.py); `confirm`, what an engine's KV events say it
stored (`engine`, a fact). The engine's word is final: a guess recorded over a block the engine
reported leaves it `engine`, and the engine's store of a guessed block makes it `engine` in place.
Otherwise the latest writer names an entry. `sources` counts a worker's entries by writer.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final, Literal

from xpyd_router.kv.tier_index import TierIndex

DEFAULT_CAPACITY_BLOCKS = 1 << 16
_RESCALE = 60.0  # `recent` weights are 2**(tick / half-life); rescaled before they pass 2**60
REUSED_WEIGHT = 0.25  # in `recent`, a block the worker already held counts this much of a new one

Source = Literal["own", "peer", "engine"]  # who wrote an entry: this replica's route, a peer's, the engine's event
OWN: Final = "own"
PEER: Final = "peer"
ENGINE: Final = "engine"
SOURCES: tuple[Source, ...] = (OWN, PEER, ENGINE)


class PrefixIndex:
    """Chained block hashes per worker, each worker an LRU bounded by its cache capacity.

    A global map from block hash to a bitmask of the workers holding it makes a lookup cost
    O(distinct match lengths x log(prompt blocks)) dictionary probes, whatever the worker count.
    """

    def __init__(self) -> None:
        self._owners: dict[int, int] = {}
        self._lru: dict[str, OrderedDict[int, Source]] = {}  # worker -> block -> who wrote it, oldest first
        self._capacity: dict[str, int] = {}
        self._bit: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self.fed: set[str] = set()  # workers whose engines publish KV events (every replica sees them)
        self._recent: dict[str, float] = {}  # the blocks each worker took, decayed (see `recent`)
        self._tick = 0.0  # blocks taken pool-wide, in half-lives (the pool's capacity each)
        self._pool_capacity = 0  # blocks, all workers together
        self.offloaded = TierIndex()  # the blocks the engines keep in their CPU tiers (their KV events)

    def __len__(self) -> int:
        return sum(len(lru) for lru in self._lru.values())

    @property
    def workers(self) -> list[str]:
        return list(self._bit)

    def blocks_of(self, worker: str) -> int:
        lru = self._lru.get(worker)
        return len(lru) if lru is not None else 0

    def source(self, worker: str, block: int) -> Source | None:
        """Who wrote the worker's entry for the block (None: it holds no such block)."""
        lru = self._lru.get(worker)
        return lru.get(block) if lru is not None else None

    def sources(self, worker: str | None = None) -> dict[Source, int]:
        """The worker's entries (every worker's with None) counted by writer: its own routes' guesses,
        its peers', and what the engines reported. One pass over the entries."""
        counts: Counter[Source] = Counter()
        for name, lru in self._lru.items():
            if worker is None or name == worker:
                counts.update(lru.values())
        return {source: counts[source] for source in SOURCES}

    def recent(self, worker: str) -> float:
        """The prompt blocks the worker took lately, in a unit comparable only between this index's
        workers: the blocks of every prompt routed to it, a block it already held counting
        `REUSED_WEIGHT` of a new one, and the blocks its engine stored that no route here told of;
        each weighted so that it halves in value each time the pool takes as many blocks as all its
        caches hold. Equal prefixes go to the worker with the least, which spreads new prompts as
        sglang-router's smallest tree does, over the recent past only (a worker that joins starts
        level with the least). New blocks are what evicts a cache's older prefixes, so a new prompt
        goes where cached prefixes live longest; the reused ones count a little, since they are
        load too (its prefill reads them) and a worker busy with sessions it already holds should
        not collect every new one. Simulated over ten draws against counting every block alike: RAG
        +0.03 (caches half the working set) and +0.05 points of prefix hit (caches above it), chat
        and agents within a draw's noise, agent draws falling into cache thrash 1 in 60 where they
        were 2; counting new blocks only, agents thrashed more (bench/results/cache-suite.md). The
        policy also compares it to spot a worker drawing more than its share (policy/kv.py)."""
        return self._recent.get(worker, 0.0)

    def _took(self, worker: str, count: float) -> None:
        tick = self._tick + count / max(self._pool_capacity, 1)
        if tick > _RESCALE:
            scale = 2.0**-_RESCALE
            self._recent = {w: c * scale for w, c in self._recent.items()}
            tick -= _RESCALE
        self._tick = tick
        self._recent[worker] = self._recent.get(worker, 0.0) + count * 2.0**tick

    def set_capacity(self, worker: str, blocks: int) -> None:
        """Adds the worker if new; shrinks its LRU when the capacity went down."""
        if blocks <= 0:
            raise ValueError(f"capacity of {worker!r} must be positive, got {blocks}")
        if worker not in self._bit:
            bit = next(i for i in range(len(self._bit) + 1) if i not in self._names)
            self._bit[worker] = bit
            self._names[bit] = worker
            self._lru[worker] = OrderedDict()
            # a newcomer starts level with the least taken, not below: else every tie would be its
            self._recent[worker] = min(self._recent.values(), default=0.0)
        self._pool_capacity += blocks - self._capacity.get(worker, 0)
        self._capacity[worker] = blocks
        self._evict(worker)

    def remove_worker(self, worker: str) -> None:
        self.fed.discard(worker)
        self.offloaded.clear(worker)
        bit = self._bit.pop(worker, None)
        if bit is None:
            return
        del self._names[bit]
        self._pool_capacity -= self._capacity.pop(worker)
        self._recent.pop(worker, None)
        clear = ~(1 << bit)
        for block in self._lru.pop(worker):
            mask = self._owners[block] & clear
            if mask:
                self._owners[block] = mask
            else:
                del self._owners[block]

    def record(self, worker: str, blocks: Sequence[int]) -> None:
        """The router routed these blocks to the worker: cached from now on, as far as it can tell.

        For an event-fed worker this is a guess its engine's events settle: they report the blocks
        only once computed (late, under a queue), and their removals drop the guessed blocks the
        engine evicted. Without the guess a backlogged worker's next turns look cold and move,
        recomputing their whole context elsewhere (simulated agent loops: 48% hit and 311 s TTFT p99
        where the guess keeps 94% and 0.65 s; bench/results/cache-suite.md).
        """
        self.store(worker, blocks, source=OWN)

    def record_peer(self, worker: str, blocks: Sequence[int]) -> None:
        """Another router replica routed these blocks to the worker (its route, passed on by the
        exchange): recorded as this replica records its own, a guess of the peer's (`peer`)."""
        self.store(worker, blocks, source=PEER)

    def set_fed(self, worker: str, fed: bool) -> None:
        """Switch the worker between event-fed and modelled; either way its current blocks go."""
        if (worker in self.fed) != fed:
            self.clear(worker)
            (self.fed.add if fed else self.fed.discard)(worker)

    def store(self, worker: str, blocks: Sequence[int], trim: bool = True, source: Source = OWN) -> None:
        """Marks the blocks as cached on the worker (adding it with the default capacity if unknown),
        written by `source` (a guess never renames what the engine reported); trim=False leaves the
        capacity bound to a later `trim` (after a batch of engine events)."""
        if worker not in self._bit:
            self.set_capacity(worker, DEFAULT_CAPACITY_BLOCKS)
        lru = self._lru[worker]
        flag = 1 << self._bit[worker]
        owners = self._owners
        # Newest-first for the leading blocks: the LRU then evicts a prompt's tail before its head,
        # so what a worker keeps stays a prefix (as vLLM frees blocks in reverse order).
        new = 0
        for block in reversed(blocks):
            was = lru.get(block)
            if was is not None:
                lru.move_to_end(block)
                if was != source and was != ENGINE:
                    lru[block] = source
            else:
                new += 1
                lru[block] = source
                owners[block] = owners.get(block, 0) | flag
        if blocks:
            self._took(worker, new + REUSED_WEIGHT * (len(blocks) - new))
        if trim:
            self.trim(worker)

    def confirm(self, worker: str, blocks: Sequence[int], trim: bool = True) -> None:
        """The engine stored these blocks (its KV event; their entries are `engine` from now on): the
        ones the router already recorded keep their place, since it recorded the whole prompt
        head-first when it routed it; the others enter as most recent. Moving the recorded ones would
        put the tail the engine computed above the cached prefix it reused, and the index would then
        evict that prefix first, while the engine, which frees a prompt's blocks tail first, still
        holds it (simulated RAG with caches half the working set: 0.07 points of prefix hit lost to
        prompts sent away from a worker holding their document; bench/results/cache-suite.md)."""
        lru = self._lru.get(worker)
        if lru is None:
            fresh: Sequence[int] = blocks
        else:
            fresh = []
            for block in blocks:
                was = lru.get(block)
                if was is None:
                    fresh.append(block)
                elif was != ENGINE:
                    lru[block] = ENGINE  # the guess is a fact now, in the same place
        if fresh:
            self.store(worker, fresh, trim, ENGINE)
        elif trim:
            self.trim(worker)

    def discard(self, worker: str, blocks: Iterable[int]) -> None:
        """Forgets blocks the worker no longer holds (its engine evicted them); unknown ones are skipped."""
        lru = self._lru.get(worker)
        if lru is None:
            return
        clear = ~(1 << self._bit[worker])
        owners = self._owners
        for block in blocks:
            if lru.pop(block, None) is not None:
                mask = owners[block] & clear
                if mask:
                    owners[block] = mask
                else:
                    del owners[block]

    def offload(self, worker: str, blocks: Iterable[int]) -> None:
        """The engine stored these blocks in its CPU tier (a KV event with medium CPU)."""
        self.offloaded.store(worker, blocks)

    def unload(self, worker: str, blocks: Iterable[int]) -> None:
        """The engine's CPU tier evicted these blocks."""
        self.offloaded.discard(worker, blocks)

    def clear(self, worker: str) -> None:
        """The worker holds nothing (a reset, a restart, or a switch of source); it keeps its capacity."""
        self.offloaded.clear(worker)
        lru = self._lru.get(worker)
        if lru:
            self.discard(worker, list(lru))

    def trim(self, worker: str) -> None:
        """Evicts the least recently used blocks past the worker's capacity."""
        if worker in self._lru:
            self._evict(worker)

    def _evict(self, worker: str) -> None:
        lru = self._lru[worker]
        # Also for an event-fed worker: its engine's removals keep it below, and what it holds plus
        # the router's guesses cannot exceed its cache (a looser bound let stale guesses pull requests).
        over = len(lru) - self._capacity[worker]
        if over <= 0:
            return
        clear = ~(1 << self._bit[worker])
        owners = self._owners
        for _ in range(over):
            block, _ = lru.popitem(last=False)
            mask = owners[block] & clear
            if mask:
                owners[block] = mask
            else:
                del owners[block]

    def match(self, blocks: Sequence[int], among: Iterable[str] | None = None) -> dict[str, int]:
        """Number of leading blocks each worker holds (workers with no hit are left out)."""
        get = self._owners.get
        if not blocks:
            return {}
        candidates = get(blocks[0], 0)
        if among is not None:
            wanted = 0
            for name in among:
                bit = self._bit.get(name)
                if bit is not None:
                    wanted |= 1 << bit
            candidates &= wanted
        result: dict[str, int] = {}
        right = len(blocks) - 1
        while candidates and right >= 0:
            left = 0  # every candidate holds block 0; find the deepest block any of them holds
            while left < right:
                mid = (left + right + 1) >> 1
                if get(blocks[mid], 0) & candidates:
                    left = mid
                else:
                    right = mid - 1
            deepest = get(blocks[left], 0) & candidates
            if not deepest:
                break
            candidates &= ~deepest
            while deepest:
                low = deepest & -deepest
                result[self._names[low.bit_length() - 1]] = left + 1
                deepest ^= low
            right = left - 1
        return result
