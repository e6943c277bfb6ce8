"""One data-parallel replica's ranks feeding one worker's prefix index: the worker holds what any rank holds.

Where the engine picks each request's rank, the router routes to the replica (one worker), but every
rank publishes its own KV events (its own port, hashes and seq). Each rank gets its own EngineView
over a RankIndex: it counts, per key, how many of the replica's ranks hold it, so a rank's removal or
restart drops a block from the worker only once no other rank holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xpyd_router.kv.prefix_index import PrefixIndex


class RankIndex:
    """The index as one rank's EngineView sees it (the methods it calls), counted into its replica."""

    def __init__(self, index: PrefixIndex, shared: dict[int, int]) -> None:
        self.index = index
        self.shared = shared  # key -> how many of the replica's ranks hold it
        self.mine: set[int] = set()  # the keys this rank holds

    @property
    def fed(self) -> set[str]:
        return self.index.fed

    def set_fed(self, worker: str, fed: bool) -> None:
        self.index.set_fed(worker, fed)

    def trim(self, worker: str) -> None:
        self.index.trim(worker)

    def confirm(self, worker: str, blocks: Sequence[int], trim: bool = True) -> None:
        counts, mine = self.shared, self.mine
        for key in blocks:
            if key not in mine:
                mine.add(key)
                counts[key] = counts.get(key, 0) + 1
        self.index.confirm(worker, blocks, trim)

    def discard(self, worker: str, blocks: Iterable[int]) -> None:
        counts, mine = self.shared, self.mine
        gone = []
        for key in blocks:
            if key not in mine:
                continue
            mine.discard(key)
            left = counts.get(key, 1) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)
                gone.append(key)
        self.index.discard(worker, gone)

    def offload(self, worker: str, blocks: Iterable[int]) -> None:
        """A rank's CPU tier stored blocks (the replica's CPU tier is the union of its ranks')."""
        self.index.offload(worker, blocks)

    def unload(self, worker: str, blocks: Iterable[int]) -> None:
        """A rank's CPU tier dropped blocks: gone from the replica's CPU tier (not counted per rank, so
        another rank's copy is forgotten too: the router then undercounts, never overcounts)."""
        self.index.unload(worker, blocks)

    def clear(self, worker: str) -> None:
        """This rank holds nothing now (it cleared its cache or restarted); the others keep theirs."""
        self.discard(worker, list(self.mine))
