"""The blocks each worker's engine keeps in its CPU tier (KV offloading), as its KV events say.

An engine that offloads KV (vLLM's native offloading, LMCache) publishes `BlockStored` with medium
CPU when a block reaches host memory and `BlockRemoved` with medium CPU when the tier evicts it; its
GPU events go on as before (a block evicted from the GPU is removed there, and may stay on the CPU).
`PrefixIndex` keeps the GPU tier; this keeps the CPU one beside it, per worker, and knows what a
reload from it costs (`pricing`, set by whoever knows the model and the hardware: the router's
flags, the simulator), or counts a CPU-held block at a fixed share of a GPU-held one instead
(`fixed`: llm-d's rule weighs it 0.4, whatever the request). A scorer reads both
(xpyd_router/policy/scorers/tiers.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xpyd_router.kv.tier_cost import ReloadCost

TIERS = ("gpu", "cpu")  # the tiers the router tells apart, as its metrics label them


class TierIndex:
    """Per worker, the router keys of the blocks its engine holds in host memory."""

    __slots__ = ("_held", "_worth", "block_tokens", "fixed", "pricing")

    def __init__(self, pricing: ReloadCost | None = None, block_tokens: int = 16) -> None:
        self._held: dict[str, set[int]] = {}
        self._worth: dict[tuple[int, int], float] = {}
        self.pricing = pricing  # what a reload costs against a recompute; None: CPU blocks count nothing
        self.fixed: float | None = None  # a CPU-held block's weight whatever it costs (instead of pricing)
        self.block_tokens = block_tokens  # tokens per router block

    def price(self, pricing: ReloadCost | None, block_tokens: int, fixed: float | None = None) -> None:
        """Set what reloads cost and how many tokens a block holds; `fixed` (in (0, 1]) counts every
        CPU-held block at that share of a GPU-held one instead of pricing its reload."""
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if fixed is not None and not 0.0 < fixed <= 1.0:
            raise ValueError(f"a fixed CPU-block weight must be in (0, 1], got {fixed}")
        self.pricing, self.block_tokens, self.fixed = pricing, block_tokens, fixed
        self._worth.clear()

    @property
    def counted(self) -> bool:
        """Whether a CPU-held block counts for anything (priced, or at a fixed weight)."""
        return self.fixed is not None or self.pricing is not None

    def worth(self, gpu_blocks: int, cpu_blocks: int) -> float:
        """The share of a GPU-held block a CPU-held one is worth, for `cpu_blocks` held on the CPU after
        `gpu_blocks` on the GPU: the fixed weight when one is set, else what reloading them saves of
        recomputing them (0 without pricing)."""
        if cpu_blocks <= 0:
            return 0.0
        if self.fixed is not None:
            return self.fixed
        pricing = self.pricing
        if pricing is None:
            return 0.0
        key = (gpu_blocks, cpu_blocks)
        got = self._worth.get(key)
        if got is None:
            size = self.block_tokens
            got = self._worth[key] = pricing.worth(gpu_blocks * size, cpu_blocks * size)
            if len(self._worth) > 1 << 16:
                self._worth.clear()
        return got

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._held.values())

    def __bool__(self) -> bool:
        return any(self._held.values())

    def blocks_of(self, worker: str) -> int:
        return len(self._held.get(worker, ()))

    def holds(self, worker: str, key: int) -> bool:
        keys = self._held.get(worker)
        return keys is not None and key in keys

    def store(self, worker: str, keys: Iterable[int]) -> None:
        """The engine offloaded these blocks to its CPU tier."""
        self._held.setdefault(worker, set()).update(keys)

    def discard(self, worker: str, keys: Iterable[int]) -> None:
        """The engine's CPU tier evicted these blocks (unknown ones are skipped)."""
        held = self._held.get(worker)
        if held is not None:
            held.difference_update(keys)

    def clear(self, worker: str) -> None:
        """The worker holds nothing on its CPU tier (a reset, a restart, a worker gone)."""
        self._held.pop(worker, None)

    def run(self, worker: str, blocks: Sequence[int], start: int) -> int:
        """How many of the prompt's blocks from `start` on the worker's CPU tier holds, one after another."""
        held = self._held.get(worker)
        if not held:
            return 0
        n = start
        while n < len(blocks) and blocks[n] in held:
            n += 1
        return n - start
