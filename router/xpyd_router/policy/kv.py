"""The KV-aware policy: longest cached prefix, then a stable home, within bounds on load; NVLink-first decode.

Prefill (or the one hop of a co-located pool) goes to the first worker, in an order every router
replica computes alike, that is within its bounds: workers holding a longer cached prefix of the
prompt first; among equals the one that took the fewest prompt blocks lately (`PrefixIndex.recent`;
only where the replicas share the picture: one router, or engine events), then by rendezvous weight
of the request's affinity key (its leading blocks). The
bounds: in-flight requests below `load_factor` x the pool's mean (+ `load_slack`) and in-flight
uncached prompt blocks, this request's included, within `load_factor` x their mean (+ `work_slack`);
`stick_factor` replaces `load_factor` for a worker whose lead over the runner-up is `stick_blocks`
or `stick_share` of the prompt (moving it would recompute that much), `hot_stick_factor` while that
worker took more than `hot_recent` x the pool's mean of blocks lately (a hot spot: one prefix
drawing more than a worker's share). A prefix thus stays on one
worker until that worker is really busier than the rest, then spills to the worker within bounds
with the least prefill work ahead of the request (its in-flight uncached blocks plus this request's
uncached blocks there: a worker holding part of the prompt costs less), the same on every replica
given the shared counts, instead of being spread over the pool by small load differences, which copies it
into every cache and, with caches smaller than the working set, evicts what the other prefixes
needed. Stickiness needs an index the replicas share: with KV events every replica sees the
engines' caches, and replicas that pass each other their routes (loadshare.py; `RouterContext.routes_shared`)
record the same guesses; a replica that knows only its own routes and has peers (`RouterContext.replicas` > 1)
uses `load_factor` alone, since each replica's private index would pin prefixes to different
workers and pile load where the others cannot see why (simulated: 2 replicas on the chat shape
fell to 37% hit, 46% SLO with stickiness, 68% / 95% without; bench/results/cache-replicas.md).
When every worker is over its bounds, the least loaded one. With a prefill pool, a prompt
that a decode worker within the load bound holds all but `direct_below_blocks` of goes straight
to the one holding the most, so a conversation keeps extending one cache; so does one of which a
decode worker holds `direct_lead_blocks` more than any prefill worker, and 4x what is left, with at
most `direct_max_blocks` left (conditional disaggregation: simulated on the Mooncake conversation
trace with caches half the working set, 7.9% prefix hit instead of 5.6% at the same TTFT p99;
bench/results/cache-suite.md; the ratio keeps wide-EP decode ranks' ITL p99 where it was,
bench/results/dp-ranks.md). The trade-off was chosen
on the workload suite of bench/cache (chat, RAG, agents, the shared traces; caches larger and
smaller than the working set): bench/results/cache-suite.md.

The policy is composed of the parts of policy/parts.py: the order is the scorers of
`KvAwareConfig.scorers` (`prefix`, `recent`, `rendezvous`: xpyd_router/policy/scorers/), the bounds are
the filter `LoadBound`, the straight-to-decode rule is the P/D decider `BreakEvenDecider`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from xpyd_router.hashing import weight
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, WorkerState
from xpyd_router.policy.base import BasePolicy, tie_break
from xpyd_router.policy.parts import Filter, Ranked, RouteView, Scorer, ScorerWeight, rank
from xpyd_router.policy.scorers import make_scorers

BLOCK_TOKENS = 64  # the block size the knobs' block counts assume
# The first hop's order: cached prefix (a block in a worker's CPU tier counted by what its reload saves,
# where the router knows the hardware; else exactly the GPU-held prefix), then the fewest blocks taken
# lately (where the replicas share the picture), then the rendezvous weight of the request's key
# (xpyd_router/policy/scorers/).
DEFAULT_SCORERS = (ScorerWeight("tiers"), ScorerWeight("recent"), ScorerWeight("rendezvous"))


@dataclass
class KvAwareConfig:
    direct_below_blocks: int = 8  # uncached prompt shorter than this: skip prefill (0: never skip it)
    load_factor: float = 1.15  # a worker takes a request while its load < load_factor x mean load + load_slack
    load_slack: float = 1.0  # requests: keeps a lightly loaded pool on its affinity
    stick_blocks: int = 16  # a request with this many more cached blocks on a worker than elsewhere...
    stick_factor: float = 3.0  # ...stays there until its load reaches stick_factor x mean + load_slack
    stick_share: float = 0.2  # or holding this share of the prompt more than any other
    hot_recent: float = 1.2  # a holder that took more than this x the pool's mean of blocks lately
    hot_stick_factor: float = 2.0  # (PrefixIndex.recent, a hot spot) gets this bound instead: it spills sooner
    work_slack: float = 64.0  # blocks: the bound on a worker's in-flight uncached prompt blocks is
    # load_factor x the pool's mean + work_slack (what the router sent and is still being computed)
    direct_lead_blocks: int = 16  # a decode worker holding this many more blocks than any prefill worker,
    direct_lead_ratio: float = 4.0  # and this many times what is left, computes the rest itself
    direct_max_blocks: int = 64  # when that is at most this many blocks (lead 0: never)
    kv_weight: float = 4.0  # decode score = load + kv_weight x KV usage
    domain_slack: float = 2.0  # accept a same-domain decode worker up to this much busier
    scorers: tuple[ScorerWeight, ...] = DEFAULT_SCORERS  # the first hop's order, by name (scorers.SCORERS)

    def for_blocks(self, tokens_per_block: float) -> KvAwareConfig:
        """The same knobs for blocks of another size: the counts above are of 64-token blocks (the
        router's 256-character blocks), so 16-token engine blocks need four times as many."""
        ratio = BLOCK_TOKENS / tokens_per_block
        return replace(
            self,
            direct_below_blocks=max(1, round(self.direct_below_blocks * ratio)) if self.direct_below_blocks else 0,
            stick_blocks=max(1, round(self.stick_blocks * ratio)),
            direct_lead_blocks=max(1, round(self.direct_lead_blocks * ratio)) if self.direct_lead_blocks else 0,
            direct_max_blocks=max(1, round(self.direct_max_blocks * ratio)),
            work_slack=self.work_slack * ratio,
        )


class LoadBound:
    """The filter of the kv-aware first hop: keeps the workers within their bounds on load.

    In-flight requests below `load_factor` x the pool's mean (+ `load_slack`) and in-flight uncached
    prompt blocks, this request's included, within `load_factor` x their mean (+ `work_slack`). The
    ranking's first worker gets `stick_factor` instead when its lead over the runner-up is
    `stick_blocks` or `stick_share` of the prompt and the replicas share the index, or the hot-spot
    bound `hot_stick_factor` while it took more than `hot_recent` x the pool's mean lately."""

    def __init__(self, config: KvAwareConfig) -> None:
        self.config = config

    def admits(self, ranked: Ranked) -> Callable[[int], bool]:
        cfg = self.config
        # a priced reload is work the request does not bring (`Ranked.credits`; the GPU-held prefix alone otherwise)
        view, workers, hits = ranked.view, ranked.workers, ranked.credits
        n = len(workers)
        size = len(view.req.blocks)
        load = work = 0.0
        for w in workers:
            load += w.load
            work += w.work
        # the request itself counts, so an idle pool still has room for it on each worker
        mean_load, mean_work = (load + 1.0) / n, (work + size - hits[0]) / n
        first = cfg.load_factor
        lead = hits[0] - (hits[1] if n > 1 else 0)
        if view.shared and lead and (lead >= cfg.stick_blocks or lead >= cfg.stick_share * size):  # only it holds it
            first = self.stick_factor(workers, ranked.at(0).name, view.index)

        def within(r: int) -> bool:
            factor = first if r == 0 else cfg.load_factor
            w = ranked.at(r)
            return (
                w.load < factor * mean_load + cfg.load_slack
                and w.work + size - hits[r] <= factor * mean_work + cfg.work_slack
            )

        return within

    def stick_factor(self, workers: Sequence[WorkerState], holder: str, index: PrefixIndex) -> float:
        """The load bound of the only worker holding a prompt's prefix: `stick_factor`, or
        `hot_stick_factor` while it took more than `hot_recent` x the pool's mean of blocks lately.
        A prefix that draws more traffic than its holder's share (an agent kind's tool preamble, a
        popular document) then spreads to a second worker before the sessions it attracts outgrow
        that worker's cache; the others keep their prefixes up to the wider bound."""
        cfg = self.config
        taken = index.recent(holder)
        if taken * len(workers) > cfg.hot_recent * sum(index.recent(w.name) for w in workers):
            return cfg.hot_stick_factor
        return cfg.stick_factor


class BreakEvenDecider:
    """The kv-aware P/D decider: a decode worker computes the rest of a prompt itself, skipping
    prefill, when that costs less than a prefill would (conditional disaggregation).

    It does when some decode worker whose decode score (load and KV usage) is within the load bound
    holds all but a short tail (`direct_below_blocks`), or `direct_lead_blocks` more than any prefill
    worker (what a prefill would reuse), at least `direct_lead_ratio` times what is left, with at most
    `direct_max_blocks` left: a conversation whose earlier turns the prefill pool has evicted but the
    decode worker that answered them still holds (its pool sees a share of the traffic, so its cache
    keeps a longer window). The ratio keeps the prefill work a decode worker takes on, which slows its
    token streams, to a quarter of the work it saves. The request goes to the one holding the most
    (then by rendezvous weight), so a conversation that went there keeps going there and its prefix
    stays whole on one worker."""

    def __init__(self, config: KvAwareConfig) -> None:
        self.config = config

    def direct(self, view: RouteView, prefill: Sequence[WorkerState], decode: Sequence[WorkerState]) -> Decision | None:
        cfg = self.config
        matches = view.matches
        total = len(view.req.blocks)
        prefilled = max((matches.get(w.name, 0) for w in prefill), default=0)
        if not self.completes(total, max(matches.values(), default=0), prefilled):  # else no decode worker can
            return None
        key = view.req.key
        scores = [w.load + cfg.kv_weight * w.kv_usage for w in decode]
        bound = cfg.load_factor * (sum(scores) + 1.0) / len(decode) + cfg.load_slack
        held = [(matches.get(w.name, 0), w, score) for w, score in zip(decode, scores, strict=True)]
        near = [
            (hit, weight(key, w.name), w.name)
            for hit, w, score in held
            if score < bound and self.completes(total, hit, prefilled)
        ]
        if not near:
            return None
        hit, _, name = max(near)
        return Decision(name, "short-prompt" if total - hit < cfg.direct_below_blocks else "decode-holds", hit)

    def completes(self, total: int, hit: int, prefilled: int) -> bool:
        """Whether a decode worker holding `hit` of the prompt's `total` blocks should compute the
        rest, when the prefill pool holds `prefilled` of them."""
        cfg = self.config
        left = total - hit
        if not cfg.direct_below_blocks:  # never straight to decode
            return False
        return left < cfg.direct_below_blocks or (
            cfg.direct_lead_blocks > 0
            and hit - prefilled >= max(cfg.direct_lead_blocks, cfg.direct_lead_ratio * left)
            and left <= cfg.direct_max_blocks
        )


class KvAwarePolicy(BasePolicy):
    """The first hop ranked by the configured scorers (`KvAwareConfig.scorers`), the first worker the
    filters keep (`LoadBound`), else the spill rule; the P/D decider `BreakEvenDecider`; decode by
    load, NVLink domain first."""

    name = "kv-aware"

    def __init__(self, config: KvAwareConfig | None = None) -> None:
        self.config = config or KvAwareConfig()

    @property
    def config(self) -> KvAwareConfig:
        return self._config

    @config.setter
    def config(self, config: KvAwareConfig) -> None:
        """The knobs, and the parts built from them (which read them where they stand)."""
        self._config = config
        self.bound = LoadBound(config)
        self.filters: list[Filter] = [self.bound]
        self.decider = BreakEvenDecider(config)
        self._scorers = make_scorers(config.scorers)
        self._scorers_of = config.scorers

    def scorers(self) -> list[tuple[Scorer, float]]:
        """The configured scorers with their weights (rebuilt if the configuration's list changed)."""
        if self.config.scorers is not self._scorers_of:
            self._scorers = make_scorers(self.config.scorers)
            self._scorers_of = self.config.scorers
        return self._scorers

    def pick_prefill(self, view: RouteView, workers: Sequence[WorkerState]) -> Decision:
        if len(workers) == 1:
            only = workers[0]
            hit = view.hit(only)
            return Decision(only.name, "prefix" if hit else "load", hit)
        cfg = self.config
        ranked = rank(view, workers, self.scorers())
        n = len(workers)
        tests = [f.admits(ranked) for f in self.filters]

        def kept(r: int) -> bool:
            return all(test(r) for test in tests)

        if kept(0):
            hit = ranked.hits[0]
            return Decision(ranked.at(0).name, "prefix" if hit else "affinity", hit, ranked.saved(0))
        # Spill: of the others within bounds, the one with the least prefill work ahead of the request
        # (its in-flight uncached blocks plus this request's uncached blocks there, less what a priced
        # reload saves: a worker holding part of the prompt costs less), first in rank on ties.
        size = len(view.req.blocks)
        spill: tuple[float, int] | None = None
        for r in range(1, n):
            if kept(r):
                cost = ranked.at(r).work + size - ranked.credits[r]
                if spill is None or cost < spill[0]:
                    spill = (cost, r)
        if spill is not None:
            r = spill[1]
            return Decision(ranked.at(r).name, "spill", ranked.hits[r], ranked.saved(r))
        # every worker is over its bounds: of the least loaded (within the slack), the first ranked
        least = min(w.load for w in workers) + cfg.load_slack
        r = next(r for r in range(n) if ranked.at(r).load <= least)
        return Decision(ranked.at(r).name, "load", ranked.hits[r], ranked.saved(r))

    def pick_decode(self, view: RouteView, workers: Sequence[WorkerState], prefill: WorkerState | None) -> Decision:
        cfg = self.config
        key = view.req.key
        scored = [(w.load + cfg.kv_weight * w.kv_usage, w) for w in workers]
        best = min(s for s, _ in scored)
        if prefill is not None and prefill.domain:
            near = [(s, w) for s, w in scored if w.domain == prefill.domain]
            if near:
                near_best = min(s for s, _ in near)
                if near_best <= best + cfg.domain_slack:
                    names = [w.name for s, w in near if s <= near_best + 0.5]
                    return Decision(tie_break(key, names), "same-domain")
        names = [w.name for s, w in scored if s <= best + 0.5]
        return Decision(tie_break(key, names), "least-loaded")
