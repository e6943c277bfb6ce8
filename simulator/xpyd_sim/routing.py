"""Runs the router's real WorkerPool and policies over simulated workers, as its proxy would."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Literal

from xpyd_router.hashing import AFFINITY_BLOCKS, affinity_key
from xpyd_router.kv.tier_cost import ReloadCost
from xpyd_router.model import RouterContext, RouteRequest
from xpyd_router.policy.base import first_hop_blocks
from xpyd_router.policy.registry import POLICIES, KvAwarePolicy, Policy, make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec, rank_targets
from xpyd_router.targets import split_target, target_name
from xpyd_sim.kvevents import EventBus, EventFedIndex, IndexMode
from xpyd_sim.request import SimRequest
from xpyd_sim.worker import Worker

ROUTER_BLOCK_TOKENS = 64  # the router hashes 256-character blocks: about 64 tokens at 4 chars/token
CHARS_PER_TOKEN = 4

# How a data-parallel replica's requests find their rank: `ranks`, the router sees one target per rank
# (`URL#dpR`, what xpyd's router does for vLLM) and pins it; `engine`, the router sees the replica and
# its API server picks the rank by load (vLLM's own balancing, what a rank-blind router gets).
DpRouting = Literal["ranks", "engine"]
DP_ROUTINGS: tuple[DpRouting, ...] = ("ranks", "engine")


def policy_names() -> list[str]:
    return list(POLICIES)


class SimRouter:
    """The router replicas: `route` at arrival, `prefill_done` when the prefill hop returns,
    `finished` when the decode stream ends: the pool's own begin/end calls, in the proxy's order,
    with the work the router counts per hop from its own `prefill_blocks`.

    Each replica has its own policy state, prefix index and in-flight counts (no shared state);
    requests reach them in turn, as a Kubernetes Service spreads connections. A replica's index is
    fed by its own decisions (`own`, a router without engine events), by the workers' KV events
    delivered to every replica (`events`), or by both (`events+own`).

    With `dp_routing` "ranks" a data-parallel replica is one routing target per rank, expanded by the
    router's own `rank_targets` (so the names are the product's, `URL#dpR`), each with its rank's
    cache capacity, load and KV events; the decision pins the request's rank. With "engine" the
    replica is one target whose capacity is all its ranks' and the simulated replica picks the rank.

    The simulator's prefix blocks are `block_tokens` long (512 for Mooncake's hash ids) while the
    router's are ~64 tokens, so the KV-aware policy's block-denominated knobs are rescaled to keep
    their meaning in tokens; every decision is still the router's own code.
    """

    def __init__(
        self,
        policy: str,
        block_tokens: int,
        replicas: int = 1,
        index: IndexMode = "own",
        event_delay_s: float = 0.05,
        dp_routing: DpRouting = "ranks",
        share_routes: bool = False,
        pricing: ReloadCost | None = None,
        cpu_weight: float | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"router replicas must be >= 1, got {replicas}")
        if dp_routing not in DP_ROUTINGS:
            raise ValueError(f"data-parallel routing must be one of {', '.join(DP_ROUTINGS)}, got {dp_routing!r}")
        self.name = policy
        self.block_tokens = block_tokens
        self.index_mode = index
        self.per_rank = dp_routing == "ranks"
        self.now = 0.0  # the simulated clock, for peers' rules that age their state
        self.bus = EventBus(event_delay_s, self.per_rank) if index != "own" else None
        self.pools = []
        # what discovery and the route exchange tell a router in a cluster: the replicas, and whether
        # every peer passes on its routes (as the exchange finds when every peer answers)
        context = RouterContext(replicas=replicas, routes_shared=share_routes and replicas > 1)
        for _ in range(replicas):
            impl = self._policy(policy)
            impl.set_context(context)
            pool = WorkerPool(impl, block_chars=block_tokens * CHARS_PER_TOKEN, chars_per_token=CHARS_PER_TOKEN)
            if self.bus is not None:
                pool.index = EventFedIndex(own=index == "events+own")
                self.bus.indexes.append(pool.index)
            # what the `tiers` scorer counts a CPU block as: priced, or at a fixed weight
            pool.index.offloaded.price(pricing, block_tokens, cpu_weight)
            self.pools.append(pool)
        # Replicas exchanging their load (share_load) also pass on their routes, as loadshare.py does:
        # each one's (workers, blocks) since the last exchange, recorded in the others' indexes.
        self._routes: list[list[tuple[tuple[str, ...], Sequence[int]]]] = [[] for _ in self.pools]
        if share_routes and replicas > 1:
            for log, pool in zip(self._routes, self.pools, strict=True):
                pool.on_route = lambda workers, blocks, log=log: log.append((workers, blocks))
        self._leading = max(1, AFFINITY_BLOCKS * ROUTER_BLOCK_TOKENS // block_tokens)
        self._by_name: dict[str, tuple[Worker, int | None]] = {}  # target -> (worker, rank or None)
        self.decisions: dict[str, int] = {}

    def _policy(self, name: str) -> Policy:
        impl = make_policy(name)
        if isinstance(impl, KvAwarePolicy):
            impl.config = impl.config.for_blocks(self.block_tokens)  # the trace's blocks, not the router's
        clock = getattr(impl, "use_clock", None)  # peers whose state ages (speculative entries, tree eviction)
        if clock is not None:
            clock(lambda: self.now)
        return impl

    def _pool(self, req: SimRequest) -> WorkerPool:
        return self.pools[req.rid % len(self.pools)]

    def target(self, w: Worker, rank: int) -> str:
        """The routing target that holds `rank` of `w`: the rank's own, or the worker's."""
        return target_name(w.name, rank) if self.per_rank and w.ranks > 1 else w.name

    def targets(self, w: Worker) -> list[WorkerSpec]:
        """The routing targets of a worker, as discovery gives them to the router."""
        spec = WorkerSpec(w.name, "worker" if w.role == "worker" else w.role, w.domain)  # type: ignore[arg-type]
        return rank_targets(spec, w.ranks) if self.per_rank else [spec]

    def set_workers(self, workers: Iterable[Worker]) -> None:
        """Level-based: the routable workers now; the rest drain in the router's pool."""
        every = list(workers)
        live = [w for w in every if w.state == "ready"]
        if self.bus is not None:
            self.bus.watch(every)
        specs: list[WorkerSpec] = []
        caps: dict[str, int] = {}
        for w in live:
            for spec in self.targets(w):
                rank = split_target(spec.url)[1]
                self._by_name[spec.url] = (w, rank)
                caps[spec.url] = sum(c.capacity for c in w.caches) if rank is None else w.caches[rank].capacity
                specs.append(spec)
        for pool in self.pools:
            pool.set_workers(specs)
            for name, cap in caps.items():
                state = pool.workers[name]
                blocks = max(1, cap)
                if state.capacity_blocks != blocks:
                    state.capacity_blocks = blocks
                    pool.index.set_capacity(name, blocks)

    def scrape(self) -> None:
        """What the router's /metrics scrape loop learns: queue, running and KV usage per target
        (a rank target: its rank's, as vLLM labels each engine's gauges)."""
        for pool in self.pools:
            for name, state in pool.workers.items():
                w, rank = self._by_name[name]
                if rank is None:
                    state.waiting = float(w.queued)
                    state.running = float(w.busy)
                    state.kv_usage = min(1.0, w.kv_usage)
                else:
                    state.waiting = float(w.rank_queued[rank])
                    state.running = float(w.rank_busy[rank])
                    state.kv_usage = min(1.0, w.rank_kv[rank] / w.rank_cap) if w.rank_cap else 1.0

    def share_load(self) -> None:
        """Each replica learns the in-flight counts the others have on every worker (load sharing),
        and records the routes the others chose since the last exchange."""
        for i, log in enumerate(self._routes):
            others = [pool for j, pool in enumerate(self.pools) if j != i]
            for (workers, keys), pool in itertools.product(log, others):
                for name in workers:
                    if name in pool.workers:
                        pool.index.record_peer(name, keys)
            log.clear()
        totals: dict[str, list[int]] = {}
        for pool in self.pools:
            for name, state in pool.workers.items():
                t = totals.setdefault(name, [0, 0])
                t[0] += state.inflight
                t[1] += state.inflight_blocks
        for pool in self.pools:
            for name, state in pool.workers.items():
                count, blocks = totals[name]
                state.peer_inflight, state.peer_blocks = count - state.inflight, blocks - state.inflight_blocks

    def route(self, req: SimRequest) -> tuple[Worker | None, Worker, int]:
        """(prefill worker or None for one hop, decode worker, the prefill hop's counted work).

        The first hop begins now, with the work the proxy counts for it (`prefill_blocks`). A rank
        target's rank is pinned on the request (`prefill_rank`, `decode_rank`; -1: the replica picks).
        """
        key = affinity_key(req.blocks, str(req.rid), self._leading)
        route = RouteRequest(req.blocks, key, req.prompt_tokens * CHARS_PER_TOKEN)
        pool = self._pool(req)
        plan = pool.route(route)
        decode, decode_rank = self._by_name[plan.decode.worker]
        req.decode_rank = -1 if decode_rank is None else decode_rank
        first = plan.prefill or plan.decode
        self.decisions[first.reason] = self.decisions.get(first.reason, 0) + 1
        work = first_hop_blocks(plan, route)
        pool.begin(first.worker, work)
        if plan.prefill is None:
            req.prefill_rank = req.decode_rank
            return None, decode, work
        prefill, prefill_rank = self._by_name[plan.prefill.worker]
        req.prefill_rank = -1 if prefill_rank is None else prefill_rank
        return prefill, decode, work

    def prefill_done(self, req: SimRequest, work: int) -> None:
        """The prefill hop answered: its in-flight count drops, the decode hop begins (the vLLM order)."""
        assert req.prefill_worker is not None
        assert req.decode_worker is not None
        pool = self._pool(req)
        pool.end(self.target(req.prefill_worker, req.prefill_rank), work)
        pool.begin(self.target(req.decode_worker, req.decode_rank))

    def first_token(self, req: SimRequest, work: int) -> None:
        """A one-hop request's first token: its prompt is computed, the worker's in-flight work drops."""
        assert req.decode_worker is not None
        self._pool(req).prefilled(self.target(req.decode_worker, req.decode_rank), work)

    def finished(self, req: SimRequest) -> None:
        assert req.decode_worker is not None
        self._pool(req).end(self.target(req.decode_worker, req.decode_rank))
