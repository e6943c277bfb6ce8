"""The simple policies users may pick (router.policy): round robin and least loaded, blind to the NVLink domain."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.model import Decision, NoWorker, RouteRequest, WorkerState
from xpyd_router.policy_base import BasePolicy, tie_break
from xpyd_router.prefix_index import PrefixIndex


class SameRulePolicy(BasePolicy):
    """A baseline that picks prefill and decode workers by one rule, blind to the NVLink domain."""

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        raise NotImplementedError

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        if not workers:
            raise NoWorker("prefill")
        return self.choose("prefill", req, workers, index)

    def choose_decode(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        prefill: WorkerState | None,
        index: PrefixIndex,
    ) -> Decision:
        if not workers:
            raise NoWorker("decode")
        return self.choose("decode", req, workers, index)


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
