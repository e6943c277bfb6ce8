"""The simple policies users may pick (router.policy): round robin and least loaded, blind to the NVLink domain."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, RouteRequest, WorkerState
from xpyd_router.policy.base import BasePolicy, tie_break
from xpyd_router.policy.parts import RouteView


class SameRulePolicy(BasePolicy):
    """A baseline that picks prefill and decode workers by one rule, blind to the NVLink domain."""

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        raise NotImplementedError

    def pick_prefill(self, view: RouteView, workers: Sequence[WorkerState]) -> Decision:
        return self.choose("prefill", view.req, workers, view.index)

    def pick_decode(self, view: RouteView, workers: Sequence[WorkerState], prefill: WorkerState | None) -> Decision:
        return self.choose("decode", view.req, workers, view.index)


class RoundRobinPolicy(SameRulePolicy):
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        names = sorted(w.name for w in workers)
        turn = self._next.get(pool, 0)
        self._next[pool] = turn + 1
        return Decision(names[turn % len(names)], "round-robin")


class LeastLoadedPolicy(SameRulePolicy):
    name = "least-loaded"

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        best = min(w.load for w in workers)
        return Decision(tie_break(req.key, [w.name for w in workers if w.load == best]), "least-loaded")
