"""The KV-aware policy: least estimated prefill work, guarded against hot spots, NVLink-first decode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xpyd_router.model import Decision, NoWorker, Plan, RouteRequest, WorkerState
from xpyd_router.policy_base import BasePolicy, find, kv_path, tie_break
from xpyd_router.prefix_index import PrefixIndex


@dataclass
class KvAwareConfig:
    direct_below_blocks: int = 8  # uncached prompt shorter than this: skip prefill (0: never)
    blocks_per_queued: float = 16.0  # prefill work assumed per queued request the router did not send
    inflight_share: float = (
        0.1  # weight of queued in-flight prefill work vs this request's own uncached work (tuned on the replay)
    )
    guard_ratio: float = 2.0  # a worker above guard_ratio x least load + guard_abs is a hot spot
    guard_abs: float = 4.0
    tie_blocks: float = 1.0  # costs this close count as equal: rendezvous hashing decides
    kv_weight: float = 4.0  # decode score = load + kv_weight x KV usage
    domain_slack: float = 2.0  # accept a same-domain decode worker up to this much busier


class KvAwarePolicy(BasePolicy):
    name = "kv-aware"

    def __init__(self, config: KvAwareConfig | None = None) -> None:
        self.config = config or KvAwareConfig()

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        return self._prefill(req, workers, index.match(req.blocks))

    def _prefill(self, req: RouteRequest, workers: Sequence[WorkerState], matches: Mapping[str, int]) -> Decision:
        if not workers:
            raise NoWorker("prefill")
        cfg = self.config
        limit = cfg.guard_ratio * min(w.load for w in workers) + cfg.guard_abs
        total = len(req.blocks)
        costs: list[tuple[float, WorkerState]] = []
        for w in workers:
            queued = max(cfg.inflight_share * w.inflight_blocks, (w.waiting + w.running) * cfg.blocks_per_queued)
            costs.append((total - matches.get(w.name, 0) + queued, w))
        cool = [(c, w) for c, w in costs if w.load <= limit]
        best_all = min(c for c, _ in costs)
        best = min(c for c, _ in cool)
        tied = [w.name for c, w in cool if c <= best + cfg.tie_blocks]
        chosen = tie_break(req.key, tied)
        hit = matches.get(chosen, 0)
        if best_all < best and any(matches.get(w.name, 0) for c, w in costs if c == best_all):
            reason = "hotspot-guard"
        elif hit and hit == max(matches.get(w.name, 0) for w in workers):
            reason = "prefix"
        elif len(tied) > 1:
            reason = "affinity"
        else:
            reason = "load"
        return Decision(chosen, reason, hit)

    def choose_decode(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        prefill: WorkerState | None,
        index: PrefixIndex,
    ) -> Decision:
        if not workers:
            raise NoWorker("decode")
        cfg = self.config
        scored = [(w.load + cfg.kv_weight * w.kv_usage, w) for w in workers]
        best = min(s for s, _ in scored)
        if prefill is not None and prefill.domain:
            near = [(s, w) for s, w in scored if w.domain == prefill.domain]
            if near:
                near_best = min(s for s, _ in near)
                if near_best <= best + cfg.domain_slack:
                    names = [w.name for s, w in near if s <= near_best + 0.5]
                    return Decision(tie_break(req.key, names), "same-domain")
        names = [w.name for s, w in scored if s <= best + 0.5]
        return Decision(tie_break(req.key, names), "least-loaded")

    def plan(
        self,
        req: RouteRequest,
        prefill_workers: Sequence[WorkerState],
        decode_workers: Sequence[WorkerState],
        index: PrefixIndex,
    ) -> Plan:
        if not decode_workers:
            raise NoWorker("decode" if prefill_workers else "worker")
        matches = index.match(req.blocks)
        if not prefill_workers:
            return Plan(decode=self._prefill(req, decode_workers, matches))
        total = len(req.blocks)
        direct = self.choose_decode(req, decode_workers, None, index)
        if total - matches.get(direct.worker, 0) < self.config.direct_below_blocks:
            return Plan(decode=Decision(direct.worker, "short-prompt", matches.get(direct.worker, 0)))
        first = self._prefill(req, prefill_workers, matches)
        prefill = find(prefill_workers, first.worker)
        second = self.choose_decode(req, decode_workers, prefill, index)
        return Plan(decode=second, prefill=first, kv_path=kv_path(prefill, find(decode_workers, second.worker)))
