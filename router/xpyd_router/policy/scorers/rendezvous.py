"""Rendezvous weight of the request's affinity key: a stable home per prefix, the same on every replica."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.hashing import weight
from xpyd_router.model import WorkerState
from xpyd_router.policy.parts import RouteView


class RendezvousScorer:
    """Highest random weight of (the request's key, the worker): every replica orders alike."""

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]:
        key = view.req.key
        return [weight(key, w.name) for w in workers]
