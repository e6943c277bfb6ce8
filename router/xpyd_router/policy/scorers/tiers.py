"""Tiered prefix: the GPU-held prefix as cached, then the CPU-held run after it at what reloading it saves."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.model import WorkerState
from xpyd_router.policy.parts import RouteView


class TierScorer:
    """Workers holding more of the prompt first, a block held in host memory counted by what its reload
    saves against recomputing it (`TierIndex.worth`: 0 where the reload does not pay, as for long
    private prefixes on a saturated host link), or at the index's fixed weight when one is set (llm-d's
    rule: 0.4), a block neither tier holds as nothing.

    Without a CPU tier in the index (or with CPU blocks counted as nothing) it scores exactly as `prefix` does.
    """

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]:
        matches = view.matches
        tiers = view.index.offloaded
        if not tiers or not tiers.counted:
            return [matches.get(w.name, 0) for w in workers]
        blocks = view.req.blocks
        out: list[float] = []
        for w in workers:
            gpu = matches.get(w.name, 0)
            cpu = tiers.run(w.name, blocks, gpu)
            out.append(gpu + cpu * tiers.worth(gpu, cpu) if cpu else gpu)
        return out
