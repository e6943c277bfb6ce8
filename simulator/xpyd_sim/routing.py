"""Runs the router's real WorkerPool and policies over simulated workers, as its proxy would."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from xpyd_router.hashing import affinity_key
from xpyd_router.model import RouteRequest
from xpyd_router.policies import POLICIES, KvAwarePolicy, Policy, make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec
from xpyd_sim.request import SimRequest
from xpyd_sim.worker import Worker

ROUTER_BLOCK_TOKENS = 64  # the router hashes 256-character blocks: about 64 tokens at 4 chars/token
CHARS_PER_TOKEN = 4


def policy_names() -> list[str]:
    return list(POLICIES)


class SimRouter:
    """One router replica: `route` at arrival, `prefill_done` when the prefill hop returns,
    `finished` when the decode stream ends, mirroring the proxy's begin/end accounting.

    The simulator's prefix blocks are `block_tokens` long (512 for Mooncake's hash ids) while the
    router's are ~64 tokens, so the KV-aware policy's block-denominated knobs are rescaled to keep
    their meaning in tokens; every decision is still the router's own code.
    """

    def __init__(self, policy: str, block_tokens: int, replicas: int = 1) -> None:
        if replicas < 1:
            raise ValueError(f"router replicas must be >= 1, got {replicas}")
        self.name = policy
        self.block_tokens = block_tokens
        # Each replica has its own policy state, prefix index and in-flight counts (no shared state);
        # requests reach them in turn, as a Kubernetes Service spreads connections.
        self.pools = [
            WorkerPool(
                self._policy(policy), block_chars=block_tokens * CHARS_PER_TOKEN, chars_per_token=CHARS_PER_TOKEN
            )
            for _ in range(replicas)
        ]
        self._by_name: dict[str, Worker] = {}
        self.decisions: dict[str, int] = {}

    def _policy(self, name: str) -> Policy:
        impl = make_policy(name)
        if isinstance(impl, KvAwarePolicy):
            ratio = ROUTER_BLOCK_TOKENS / self.block_tokens
            cfg = impl.config
            impl.config = replace(
                cfg,
                direct_below_blocks=max(1, round(cfg.direct_below_blocks * ratio)) if cfg.direct_below_blocks else 0,
                blocks_per_queued=cfg.blocks_per_queued * ratio,
                tie_blocks=cfg.tie_blocks * ratio,
            )
        return impl

    def _pool(self, req: SimRequest) -> WorkerPool:
        return self.pools[req.rid % len(self.pools)]

    def set_workers(self, workers: Iterable[Worker]) -> None:
        """Level-based: the routable workers now; the rest drain in the router's pool."""
        live = [w for w in workers if w.state == "ready"]
        for w in live:
            self._by_name[w.name] = w
        specs = [WorkerSpec(w.name, "worker" if w.role == "worker" else w.role, w.domain) for w in live]  # type: ignore[arg-type]
        for pool in self.pools:
            pool.set_workers(specs)
            for w in live:
                state = pool.workers[w.name]
                blocks = max(1, w.kv_cap // self.block_tokens)
                if state.capacity_blocks != blocks:
                    state.capacity_blocks = blocks
                    pool.index.set_capacity(w.name, blocks)

    def scrape(self) -> None:
        """What the router's /metrics scrape loop learns: queue, running and KV usage per worker."""
        for pool in self.pools:
            for name, state in pool.workers.items():
                w = self._by_name[name]
                state.waiting = float(w.queued)
                state.running = float(w.busy)
                state.kv_usage = min(1.0, w.kv_usage)

    def route(self, req: SimRequest) -> tuple[Worker | None, Worker, int]:
        """(prefill worker or None for one hop, decode worker, blocks the router thinks are cached)."""
        blocks = req.blocks
        key = affinity_key(blocks, str(req.rid))
        pool = self._pool(req)
        plan = pool.route(RouteRequest(blocks, key, req.prompt_tokens * CHARS_PER_TOKEN))
        decode = self._by_name[plan.decode.worker]
        first = plan.prefill or plan.decode
        self.decisions[first.reason] = self.decisions.get(first.reason, 0) + 1
        if plan.prefill is None:
            pool.begin(decode.name)
            return None, decode, first.matched_blocks
        prefill = self._by_name[plan.prefill.worker]
        pool.begin(prefill.name, len(blocks) - plan.prefill.matched_blocks)
        return prefill, decode, first.matched_blocks

    def prefill_done(self, req: SimRequest, matched: int) -> None:
        """The prefill hop answered: its in-flight count drops, the decode hop begins."""
        assert req.prefill_worker is not None
        assert req.decode_worker is not None
        pool = self._pool(req)
        pool.end(req.prefill_worker.name, len(req.blocks) - matched)
        pool.begin(req.decode_worker.name)

    def finished(self, req: SimRequest) -> None:
        assert req.decode_worker is not None
        self._pool(req).end(req.decode_worker.name)
