"""One engine's KV events applied to the prefix index: engine block hashes become router block keys.

An engine names a block by its own hash (seeded per process, so two engines name the same
tokens differently) and reports the block's token ids and its parent's hash; the view keys the
block from its parent's key and depth and the tokens (`block_keys.token_block_keys`), the key a
request with those tokens computes, and remembers hash -> key to apply the engine's removals.
A block whose parent the view never saw (events lost beyond the replay buffer) cannot be keyed
and is skipped, as is a block of another size than the router's (the router adopts the engines'
size from the first block any of them reports, before it keyed any: `KvEventHub.adopt`).

An engine that offloads KV to host memory reports its CPU tier too (medium CPU): a block stored there
carries only its GPU hash (vLLM's OffloadingConnector sends no tokens), so the view keys it by the key
it learnt when the GPU stored it, and keeps that mapping while either tier holds the block. CPU blocks
of another size than the GPU's (a connector `block_size` grouping several GPU blocks) are not keyed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xpyd_router.kv.block_keys import salt_root, token_block_keys
from xpyd_router.kv.wire import CPU, Cleared, KvEvent, Removed, Stored

_KEY_MASK = (1 << 64) - 1


class IndexSink(Protocol):
    """Where a view puts what its engine holds: the prefix index, or one rank's share of a replica's
    entry in it (replica_index.RankIndex)."""

    @property
    def fed(self) -> set[str]: ...
    def set_fed(self, worker: str, fed: bool) -> None: ...
    def trim(self, worker: str) -> None: ...
    def clear(self, worker: str) -> None: ...
    def confirm(self, worker: str, blocks: Sequence[int], trim: bool = True) -> None: ...
    def discard(self, worker: str, blocks: Iterable[int]) -> None: ...
    def offload(self, worker: str, blocks: Iterable[int]) -> None: ...
    def unload(self, worker: str, blocks: Iterable[int]) -> None: ...


@dataclass
class ViewStats:
    """What the view did with the events it got (for logs and tests)."""

    stored: int = 0  # blocks keyed and added
    removed: int = 0  # blocks dropped on the engine's word
    cleared: int = 0  # AllBlocksCleared events
    resets: int = 0  # times the view started over (cleared, or the engine restarted)
    orphans: int = 0  # stored blocks whose parent was never seen: not keyed
    offloaded: int = 0  # blocks keyed into the CPU tier
    unloaded: int = 0  # blocks the CPU tier dropped
    mismatched: int = 0  # stored blocks of another block size, or with the wrong number of tokens
    batches: int = 0


class EngineView:
    """What one worker's engine holds, as its events say, kept in the shared prefix index."""

    def __init__(
        self, worker: str, index: IndexSink, block_size: int, adopt: Callable[[int], bool] | None = None
    ) -> None:
        self.worker = worker
        self.index = index
        self.block_size = block_size
        # Called with an engine's block size that is not the router's: True if the router now keys by it.
        self.adopt = adopt
        self.blocks: dict[int, int] = {}  # engine hash -> router key | depth << 64
        self.on_cpu: set[int] = set()  # engine hashes the CPU tier holds
        self.off_gpu: set[int] = set()  # of those, the ones the GPU removed (their key kept for the CPU's sake)
        self.stats = ViewStats()

    def apply(self, events: list[KvEvent]) -> None:
        """One batch, in order; the worker turns event-fed (its modelled blocks dropped) on the first."""
        self.index.set_fed(self.worker, True)
        self.stats.batches += 1
        for event in events:
            if isinstance(event, Stored):
                if event.medium == CPU:
                    self._offloaded(event)
                else:
                    self._stored(event)
            elif isinstance(event, Removed):
                if event.medium == CPU:
                    self._unloaded(event.hashes)
                else:
                    self._removed(event.hashes)
            elif isinstance(event, Cleared):
                self.reset()
                self.stats.cleared += 1
        self.index.trim(self.worker)  # after the batch: its removals come after the stores they make room for

    def reset(self) -> None:
        """The engine holds nothing (it cleared its cache or restarted)."""
        self.blocks.clear()
        self.on_cpu.clear()
        self.off_gpu.clear()
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
            parent_key, depth = salt_root(event.salt), 0
        else:
            packed = self.blocks.get(event.parent)
            if packed is None:
                self.stats.orphans += n
                return
            parent_key, depth = packed & _KEY_MASK, (packed >> 64) + 1
        keys = token_block_keys(np.asarray(event.tokens, dtype=np.int64), size, parent_key, depth)
        blocks, off_gpu = self.blocks, self.off_gpu
        for i, (engine_hash, key) in enumerate(zip(event.hashes, keys, strict=False)):
            blocks[engine_hash] = key | (depth + i) << 64
            if off_gpu:
                off_gpu.discard(engine_hash)
        self.index.confirm(self.worker, keys, trim=False)
        self.stats.stored += len(keys)

    def _removed(self, hashes: list[int]) -> None:
        gone = []
        blocks, on_cpu = self.blocks, self.on_cpu
        for engine_hash in hashes:
            if engine_hash in on_cpu:  # the CPU tier still holds it: keep its key
                packed = blocks.get(engine_hash)
                self.off_gpu.add(engine_hash)
            else:
                packed = blocks.pop(engine_hash, None)
            if packed is not None:
                gone.append(packed & _KEY_MASK)
        self.index.discard(self.worker, gone)
        self.stats.removed += len(gone)

    def _offloaded(self, event: Stored) -> None:
        """The CPU tier stored blocks the GPU computed: keyed by the keys the GPU's events gave them."""
        if event.block_size != self.block_size:
            self.stats.mismatched += len(event.hashes)
            return
        keys = []
        for engine_hash in event.hashes:
            packed = self.blocks.get(engine_hash)
            if packed is None:
                self.stats.orphans += 1
                continue
            self.on_cpu.add(engine_hash)
            keys.append(packed & _KEY_MASK)
        self.index.offload(self.worker, keys)
        self.stats.offloaded += len(keys)

    def _unloaded(self, hashes: list[int]) -> None:
        keys = []
        for engine_hash in hashes:
            if engine_hash not in self.on_cpu:
                continue
            self.on_cpu.discard(engine_hash)
            if engine_hash in self.off_gpu:  # neither tier holds it now
                self.off_gpu.discard(engine_hash)
                packed = self.blocks.pop(engine_hash)
            else:
                packed = self.blocks[engine_hash]
            keys.append(packed & _KEY_MASK)
        self.index.unload(self.worker, keys)
        self.stats.unloaded += len(keys)
