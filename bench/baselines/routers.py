"""The peers' routing rules xpyd's policies are benchmarked against (not product code).

llm-d's weighted scorers and the SGLang router's cache-aware rules, as pure policies over the same
worker state and prefix index; ``bench.baselines.register()`` adds them to the router's registry as
``llm-d`` and ``sglang``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, RouteRequest, WorkerState
from xpyd_router.policy.base import tie_break
from xpyd_router.policy.simple import SameRulePolicy


class LlmDPolicy(SameRulePolicy):
    """llm-d's weighted scorers: prefix overlap 3, waiting queue 2, free KV cache 2."""

    name = "llm-d"
    weights = (3.0, 2.0, 2.0)

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        matches = index.match(req.blocks)
        total = len(req.blocks)
        queues = [w.waiting for w in workers]
        low, high = min(queues), max(queues)
        wp, wq, wk = self.weights
        scored: list[tuple[float, str, int]] = []
        for w in workers:
            hit = matches.get(w.name, 0)
            prefix = hit / total if total else 0.0
            queue = 1.0 - (w.waiting - low) / (high - low) if high > low else 1.0
            scored.append((wp * prefix + wq * queue + wk * (1.0 - w.kv_usage), w.name, hit))
        best = max(s for s, _, _ in scored)
        chosen = tie_break(req.key, [n for s, n, _ in scored if s >= best - 1e-9])
        return Decision(chosen, "llm-d-score", next(h for _, n, h in scored if n == chosen))


class SGLangCachePolicy(SameRulePolicy):
    """SGLang router's cache-aware policy: balance when loads diverge, else longest match above 30%."""

    name = "sglang"

    def __init__(self, balance_abs: float = 64, balance_rel: float = 1.5, cache_threshold: float = 0.3):
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.cache_threshold = cache_threshold

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        loads = [w.load for w in workers]
        low, high = min(loads), max(loads)
        if high - low > self.balance_abs and high > self.balance_rel * low:
            return Decision(min(workers, key=lambda w: (w.load, w.name)).name, "sglang-balance")
        matches = index.match(req.blocks, [w.name for w in workers])
        total = len(req.blocks)
        if matches and total:
            name, hit = max(matches.items(), key=lambda item: (item[1], item[0]))
            if hit / total > self.cache_threshold:
                return Decision(name, "sglang-cache", hit)
        smallest = min(workers, key=lambda w: (index.blocks_of(w.name), w.name))
        return Decision(smallest.name, "sglang-smallest-tree", matches.get(smallest.name, 0))
