"""The parts a routing policy is composed of: filters, scorers and the P/D decider, and what they see.

A policy's first-hop choice is a composition (policy/kv.py is the one built this way):

- **scorers** (`Scorer`) give every candidate worker a score; the candidates are ranked by the tuple
  of their scores in the order the scorers are configured, each scaled by its weight (0 turns one
  off, a negative one reverses it), the candidate's position last. The order is lexicographic: a
  later scorer only breaks the ties of the earlier ones. A scorer is one module in
  `xpyd_router/policy/scorers/` and one line in its registry, `SCORERS` (docs/extend.md, "Add a scorer").
- **filters** (`Filter`) drop candidates from that ranking (the kv-aware policy's load bounds); the
  kv-aware policy takes the first-ranked worker when every filter keeps it, else of the kept ones
  the one with the least prefill work ahead of the request, else the best-ranked of the least loaded.
- the **P/D decider** (`PdDecider`) says, before any prefill worker is chosen, whether a request
  goes straight to a decode worker, which computes the rest of its prompt itself, instead of
  through the prefill pool (`Disaggregate`: never; the kv-aware policy's `BreakEvenDecider`).

Every part is a pure function of the request, the workers' states, the prefix index and the
router's context (`RouterContext`), so that router replicas seeing the same choose alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, RouterContext, RouteRequest, WorkerState


class RouteView:
    """One request's routing as the parts see it: the request, the index and the router's context,
    with what more than one part needs computed once (the cached prefix each worker holds)."""

    __slots__ = ("_matches", "_priced", "_saved", "context", "index", "req")

    def __init__(self, req: RouteRequest, index: PrefixIndex, context: RouterContext) -> None:
        self.req = req
        self.index = index
        self.context = context
        self._matches: dict[str, int] | None = None
        self._saved: dict[str, float] = {}
        self._priced: bool | None = None

    @property
    def matches(self) -> Mapping[str, int]:
        """Leading prompt blocks each worker holds (workers with none left out), any role."""
        if self._matches is None:
            self._matches = self.index.match(self.req.blocks) if self.req.blocks else {}
        return self._matches

    def hit(self, worker: WorkerState) -> int:
        return self.matches.get(worker.name, 0)

    @property
    def priced(self) -> bool:
        """Whether a CPU-held block saves recompute by what its reload costs (`TierIndex.pricing`, no
        fixed weight, something held): a fixed weight (llm-d's rule) ranks holders but is no cost."""
        if self._priced is None:
            tiers = self.index.offloaded
            self._priced = tiers.pricing is not None and tiers.fixed is None and bool(tiers)
        return self._priced

    def saved(self, worker: WorkerState) -> float:
        """Prompt blocks of recompute that reloading the worker's CPU-held run (after its GPU-held
        prefix) saves, where the router prices reloads (`priced`): the run times its `worth`. The
        prefill work the request brings to that worker is its uncached blocks less these; 0 unpriced."""
        name = worker.name
        got = self._saved.get(name)
        if got is None:
            got = 0.0
            if self.priced:
                tiers = self.index.offloaded
                gpu = self.matches.get(name, 0)
                cpu = tiers.run(name, self.req.blocks, gpu)
                if cpu:
                    got = cpu * tiers.worth(gpu, cpu)
            self._saved[name] = got
        return got

    @property
    def shared(self) -> bool:
        """Whether every router replica sees this index alike: one replica, caches told by the
        engines' events, or every replica's routes recorded by all."""
        ctx = self.context
        return ctx.replicas <= 1 or ctx.routes_shared or bool(self.index.fed)


@dataclass(slots=True)
class Ranked:
    """The candidates of one hop in the scorers' order: `workers` as given, `order` their positions
    best first, `hits` the GPU-held prefix of each in that order, `credits` the prompt blocks each
    need not compute (`hits` plus the recompute a priced reload saves: `RouteView.saved`)."""

    view: RouteView
    workers: Sequence[WorkerState]
    order: Sequence[int]
    hits: Sequence[int]
    credits: Sequence[float]

    def at(self, rank: int) -> WorkerState:
        return self.workers[self.order[rank]]

    def saved(self, rank: int) -> int:
        """Whole blocks of recompute a priced reload saves the worker at `rank` (`Decision.saved_blocks`)."""
        return int(self.credits[rank] - self.hits[rank])


class Scorer(Protocol):
    """Scores every candidate of a hop (higher ranks first); one score per worker, in their order."""

    def score(self, view: RouteView, workers: Sequence[WorkerState]) -> Sequence[float]: ...


class Filter(Protocol):
    """Keeps or drops the candidates of a ranking: the test a rank passes to be kept (what it needs of
    the whole ranking computed once; the policy asks only the ranks it considers, best first)."""

    def admits(self, ranked: Ranked) -> Callable[[int], bool]: ...


class PdDecider(Protocol):
    """Disaggregate or not: a decision on a decode worker that computes the whole request itself,
    or None to send it through a prefill worker first. Asked only when both pools have a worker."""

    def direct(
        self, view: RouteView, prefill: Sequence[WorkerState], decode: Sequence[WorkerState]
    ) -> Decision | None: ...


class Disaggregate:
    """The decider of policies blind to caches: every request goes through prefill."""

    def direct(self, view: RouteView, prefill: Sequence[WorkerState], decode: Sequence[WorkerState]) -> Decision | None:
        return None


@dataclass(frozen=True)
class ScorerWeight:
    """A configured scorer: its registry name and the weight its scores are scaled by."""

    name: str
    weight: float = 1.0


def rank(view: RouteView, workers: Sequence[WorkerState], scorers: Sequence[tuple[Scorer, float]]) -> Ranked:
    """The candidates ordered by the tuple of their weighted scores, scorer by scorer, then by position
    (descending throughout). A weight of exactly 1 leaves a score as it is (an integer stays exact)."""
    columns: list[Sequence[float]] = []
    for scorer, weight in scorers:
        scores = scorer.score(view, workers)
        columns.append(scores if weight == 1 else [weight * s for s in scores])
    keys = list(zip(*columns, range(len(workers)), strict=True))
    order = sorted(range(len(workers)), key=keys.__getitem__, reverse=True)
    matches = view.matches
    hits = [matches.get(workers[i].name, 0) for i in order]
    credits = [hit + view.saved(workers[i]) for hit, i in zip(hits, order, strict=True)] if view.priced else hits
    return Ranked(view, workers, order, hits, credits)
