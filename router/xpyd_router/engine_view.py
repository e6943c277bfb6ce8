"""One engine's KV events applied to the prefix index: engine block hashes become router block keys.

An engine names a block by its own hash (seeded per process, so two engines name the same
tokens differently) and reports the block's token ids and its parent's hash; the view keys the
block from its parent's key and depth and the tokens (`block_keys.token_block_keys`), the key a
request with those tokens computes, and remembers hash -> key to apply the engine's removals.
A block whose parent the view never saw (events lost beyond the replay buffer) cannot be keyed
and is skipped, as is a block of another size than the router's (the router adopts the engines'
size from the first block any of them reports, before it keyed any: `KvEventHub.adopt`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xpyd_router.block_keys import token_block_keys
from xpyd_router.kv_wire import Cleared, KvEvent, Removed, Stored
from xpyd_router.prefix_index import PrefixIndex

_KEY_MASK = (1 << 64) - 1


@dataclass
class ViewStats:
    """What the view did with the events it got (for logs and tests)."""

    stored: int = 0  # blocks keyed and added
    removed: int = 0  # blocks dropped on the engine's word
    cleared: int = 0  # AllBlocksCleared events
    resets: int = 0  # times the view started over (cleared, or the engine restarted)
    orphans: int = 0  # stored blocks whose parent was never seen: not keyed
    mismatched: int = 0  # stored blocks of another block size, or with the wrong number of tokens
    batches: int = 0


class EngineView:
    """What one worker's engine holds, as its events say, kept in the shared prefix index."""

    def __init__(
        self, worker: str, index: PrefixIndex, block_size: int, adopt: Callable[[int], bool] | None = None
    ) -> None:
        self.worker = worker
        self.index = index
        self.block_size = block_size
        # Called with an engine's block size that is not the router's: True if the router now keys by it.
        self.adopt = adopt
        self.blocks: dict[int, int] = {}  # engine hash -> router key | depth << 64
        self.stats = ViewStats()

    def apply(self, events: list[KvEvent]) -> None:
        """One batch, in order; the worker turns event-fed (its modelled blocks dropped) on the first."""
        self.index.set_fed(self.worker, True)
        self.stats.batches += 1
        for event in events:
            if isinstance(event, Stored):
                self._stored(event)
            elif isinstance(event, Removed):
                self._removed(event.hashes)
            elif isinstance(event, Cleared):
                self.reset()
                self.stats.cleared += 1
        self.index.trim(self.worker)  # after the batch: its removals come after the stores they make room for

    def reset(self) -> None:
        """The engine holds nothing (it cleared its cache or restarted)."""
        self.blocks.clear()
        self.index.clear(self.worker)
        self.stats.resets += 1

    def _stored(self, event: Stored) -> None:
        if event.block_size != self.block_size and self.adopt is not None:
            self.adopt(event.block_size)
        size, n = self.block_size, len(event.hashes)
        if event.block_size != size or len(event.tokens) != n * size:
            self.stats.mismatched += n
            return
        if event.parent is None:
            parent_key, depth = 0, 0
        else:
            packed = self.blocks.get(event.parent)
            if packed is None:
                self.stats.orphans += n
                return
            parent_key, depth = packed & _KEY_MASK, (packed >> 64) + 1
        keys = token_block_keys(np.asarray(event.tokens, dtype=np.int64), size, parent_key, depth)
        blocks = self.blocks
        for i, (engine_hash, key) in enumerate(zip(event.hashes, keys, strict=False)):
            blocks[engine_hash] = key | (depth + i) << 64
        self.index.confirm(self.worker, keys, trim=False)
        self.stats.stored += len(keys)

    def _removed(self, hashes: list[int]) -> None:
        gone = []
        for engine_hash in hashes:
            packed = self.blocks.pop(engine_hash, None)
            if packed is not None:
                gone.append(packed & _KEY_MASK)
        self.index.discard(self.worker, gone)
        self.stats.removed += len(gone)
