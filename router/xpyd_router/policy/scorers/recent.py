"""Recent intake: the prompt blocks a worker took lately (`PrefixIndex.recent`), fewest first."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.model import WorkerState
from xpyd_router.policy.parts import RouteView


class RecentScorer:
    """The worker that took the fewest prompt blocks lately first: new blocks are what evicts a
    cache's older prefixes, so a new prompt goes where cached prefixes live longest. Only where every
    router replica sees the same caches (`RouteView.shared`): else all score alike, since each
    replica's private intake would send the same prompt to different workers."""

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]:
        if not view.shared:
            return [0] * len(workers)
        recent = view.index.recent
        return [-recent(w.name) for w in workers]
