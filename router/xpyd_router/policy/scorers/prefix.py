"""Prefix overlap: the prompt's leading blocks a worker's cache holds (the index's match)."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.model import WorkerState
from xpyd_router.policy.parts import RouteView


class PrefixScorer:
    """Workers holding a longer cached prefix of the prompt first: less to compute, nothing recomputed."""

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]:
        matches = view.matches
        return [matches.get(w.name, 0) for w in workers]
