"""The peer routers' cache rules, emulated for the simulator (benchmark code, not the product).

- sglang-router `cache_aware` (sgl-project/sglang, sgl-router/src/policies/cache_aware.rs) and
  vllm-router `cache_aware` (vllm-project/router, a fork with the same rule): an approximate tree per
  router of the text each worker was sent, never told what the worker evicted (its own size bound,
  `max_tree_size` characters, is far above a GPU's cache); if the router's own in-flight counts are
  imbalanced (max - min > 64 and max > 1.5 x min) the least loaded worker, else the worker with the
  longest match when it covers more than 30% of the prompt, else the worker with the smallest tree.
- vllm-router `kv_aware` (src/policies/kv_aware.rs): an index fed by the workers' KV events; the
  worker with the longest cached prefix, least loaded when nobody has any, no load bound; the blocks
  it sends are inserted speculatively for 2 s until the events confirm them.

Block-level prefixes stand in for the trees' characters (the match ratio is the same to a block).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from xpyd_router.hashing import rendezvous
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, RouteRequest, WorkerState
from xpyd_router.policy.simple import SameRulePolicy

CHARS_PER_BLOCK = 256  # the router's blocks: 64 tokens of 4 characters


class TreeCachePolicy(SameRulePolicy):
    """SGLang's cache-aware rule over its own approximate tree (fed by its own decisions only)."""

    name = "sglang-cache-aware"
    max_tree_chars = 1 << 26  # sglang-router's default --max-tree-size

    def __init__(self, cache_threshold: float = 0.3, balance_abs: int = 64, balance_rel: float = 1.5) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.tree = PrefixIndex()
        self._known: set[str] = set()

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        tree = self.tree
        for w in workers:
            if w.name not in self._known and req.blocks:
                self._known.add(w.name)  # the tree's bound in blocks of this request's size
                chars_per_block = max(CHARS_PER_BLOCK, req.prompt_chars // len(req.blocks))
                tree.set_capacity(w.name, max(1, self.max_tree_chars // chars_per_block))
        loads = [w.inflight for w in workers]
        low, high = min(loads), max(loads)
        if high - low > self.balance_abs and high > self.balance_rel * low:
            chosen = min(workers, key=lambda w: w.inflight).name
            reason = "balance"
        else:
            matches = tree.match(req.blocks, [w.name for w in workers]) if req.blocks else {}
            best = max(matches.values(), default=0)
            if req.blocks and best / len(req.blocks) > self.cache_threshold:
                # the deepest node's tenants: one of them, the same one for every request reaching it
                chosen = rendezvous(req.blocks[best - 1], sorted(n for n, m in matches.items() if m == best))
                reason = "cache"
            else:
                chosen = min(workers, key=lambda w: (tree.blocks_of(w.name), w.name)).name
                reason = "smallest-tree"
        if req.blocks:
            tree.record(chosen, req.blocks)
        hit = index.match(req.blocks, [chosen]).get(chosen, 0) if req.blocks else 0
        return Decision(chosen, reason, hit)


class VllmTreeCachePolicy(TreeCachePolicy):
    """vllm-router's cache_aware: the same rule and defaults, a smaller tree bound."""

    name = "vllm-cache-aware"
    max_tree_chars = 1 << 25  # vllm-router's default --max-tree-size


class VllmKvAwarePolicy(SameRulePolicy):
    """vllm-router's kv_aware: the longest prefix in the event-fed index (plus 2 s speculative entries)."""

    name = "vllm-kv-aware"

    def __init__(self, speculative_s: float = 2.0) -> None:
        self.speculative_s = speculative_s
        self.speculative = PrefixIndex()
        self._expiry: deque[tuple[float, str, Sequence[int]]] = deque()
        self.clock: Callable[[], float] = lambda: 0.0

    def use_clock(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def choose(self, pool: str, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, name, blocks = self._expiry.popleft()
            self.speculative.discard(name, blocks)
        if not req.blocks:
            return Decision(min(workers, key=lambda w: w.inflight).name, "least-load")
        names = [w.name for w in workers]
        real = index.match(req.blocks, names)
        guess = self.speculative.match(req.blocks, names)
        scores = [max(real.get(n, 0), guess.get(n, 0)) for n in names]
        best = max(scores)
        if best == 0:
            chosen, reason = min(workers, key=lambda w: w.inflight).name, "least-load"
        else:
            chosen, reason = names[len(scores) - 1 - scores[::-1].index(best)], "prefix"  # Rust's max_by_key: the last
        score = max(real.get(chosen, 0), guess.get(chosen, 0))
        if score < len(req.blocks):
            fresh = req.blocks[score:]
            self.speculative.record(chosen, fresh)
            self._expiry.append((now + self.speculative_s, chosen, fresh))
        return Decision(chosen, reason, real.get(chosen, 0))


PEERS: dict[str, type[SameRulePolicy]] = {
    "sglang-cache-aware": TreeCachePolicy,
    "vllm-cache-aware": VllmTreeCachePolicy,
    "vllm-kv-aware": VllmKvAwarePolicy,
}


def register() -> None:
    """Make the peers selectable by name in the router's registry (what the simulator looks up)."""
    from xpyd_router.policy.registry import POLICIES

    POLICIES.update(PEERS)
