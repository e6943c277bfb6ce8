"""The kv-aware policy as a composition of scorers, a filter and a P/D decider chooses exactly as the
one lexicographic sort it replaced: the old code is kept below as the oracle, and both are asked the
same questions over many random pools, indexes, contexts and knobs."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from xpyd_router.hashing import weight
from xpyd_router.model import Decision, NoWorker, Plan, RouterContext, RouteRequest, WorkerState
from xpyd_router.policy.base import find, kv_path, pairable, partners, tie_break
from xpyd_router.policy.parts import RouteView, ScorerWeight, rank
from xpyd_router.policy.registry import KvAwareConfig, KvAwarePolicy, PrefixIndex
from xpyd_router.policy.scorers import SCORERS, make_scorers


class OldKvAware:
    """The kv-aware policy before it was composed (one sort tuple, a private direct-to-decode rule),
    copied unchanged but for the names: the oracle."""

    def __init__(self, config: KvAwareConfig, replicas: int = 1, routes_shared: bool = False) -> None:
        self.config = config
        self.replicas = replicas
        self.routes_shared = routes_shared

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        matches = index.match(req.blocks) if req.blocks else {}
        return self._prefill(req, workers, matches, self._shared(index), index)

    def _shared(self, index: PrefixIndex) -> bool:
        return self.replicas <= 1 or self.routes_shared or bool(index.fed)

    def _prefill(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        matches: Mapping[str, int],
        sticky: bool,
        index: PrefixIndex,
    ) -> Decision:
        if not workers:
            raise NoWorker("prefill")
        if len(workers) == 1:
            only = workers[0]
            return Decision(only.name, "prefix" if matches.get(only.name) else "load", matches.get(only.name, 0))
        cfg = self.config
        key = req.key
        n = len(workers)
        size = len(req.blocks)
        load = work = 0.0
        for w in workers:
            load += w.load
            work += w.work
        ranked = sorted(
            (
                (matches.get(w.name, 0), -index.recent(w.name) if sticky else 0, weight(key, w.name), i)
                for i, w in enumerate(workers)
            ),
            reverse=True,
        )
        mean_load, mean_work = (load + 1.0) / n, (work + size - ranked[0][0]) / n
        factor = cfg.load_factor
        lead = ranked[0][0] - ranked[1][0]
        if sticky and lead and (lead >= cfg.stick_blocks or lead >= cfg.stick_share * size):
            factor = self._stick_factor(workers, workers[ranked[0][3]].name, index)
        spill = None
        for i, (hit, _, _, at) in enumerate(ranked):
            w = workers[at]
            if (
                w.load < factor * mean_load + cfg.load_slack
                and w.work + size - hit <= factor * mean_work + cfg.work_slack
            ):
                if not i:
                    return Decision(w.name, "prefix" if hit else "affinity", hit)
                cost = w.work + size - hit
                if spill is None or cost < spill[0]:
                    spill = (cost, w.name, hit)
            factor = cfg.load_factor
        if spill is not None:
            return Decision(spill[1], "spill", spill[2])
        least = min(w.load for w in workers) + cfg.load_slack
        hit, _, _, at = next(r for r in ranked if workers[r[3]].load <= least)
        return Decision(workers[at].name, "load", hit)

    def _stick_factor(self, workers: Sequence[WorkerState], holder: str, index: PrefixIndex) -> float:
        cfg = self.config
        taken = index.recent(holder)
        if taken * len(workers) > cfg.hot_recent * sum(index.recent(w.name) for w in workers):
            return cfg.hot_stick_factor
        return cfg.stick_factor

    def choose_decode(self, req: RouteRequest, workers: Sequence[WorkerState], prefill: WorkerState | None) -> Decision:
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

    def _direct(
        self, req: RouteRequest, workers: Sequence[WorkerState], matches: Mapping[str, int], prefilled: int
    ) -> Decision | None:
        cfg = self.config
        total = len(req.blocks)
        scores = [w.load + cfg.kv_weight * w.kv_usage for w in workers]
        bound = cfg.load_factor * (sum(scores) + 1.0) / len(workers) + cfg.load_slack
        held = [(matches.get(w.name, 0), w, score) for w, score in zip(workers, scores, strict=True)]
        near = [
            (hit, weight(req.key, w.name), w.name)
            for hit, w, score in held
            if score < bound and self._completes(total, hit, prefilled)
        ]
        if not near:
            return None
        hit, _, name = max(near)
        return Decision(name, "short-prompt" if total - hit < cfg.direct_below_blocks else "decode-holds", hit)

    def _completes(self, total: int, hit: int, prefilled: int) -> bool:
        cfg = self.config
        left = total - hit
        if not cfg.direct_below_blocks:
            return False
        return left < cfg.direct_below_blocks or (
            cfg.direct_lead_blocks > 0
            and hit - prefilled >= max(cfg.direct_lead_blocks, cfg.direct_lead_ratio * left)
            and left <= cfg.direct_max_blocks
        )

    def plan(
        self,
        req: RouteRequest,
        prefill_workers: Sequence[WorkerState],
        decode_workers: Sequence[WorkerState],
        index: PrefixIndex,
    ) -> Plan:
        if not decode_workers:
            raise NoWorker("decode" if prefill_workers else "worker")
        matches = index.match(req.blocks) if req.blocks else {}
        sticky = self._shared(index)
        prefill_workers = pairable(prefill_workers, decode_workers)
        if not prefill_workers:
            return Plan(decode=self._prefill(req, decode_workers, matches, sticky, index))
        prefilled = max((matches.get(w.name, 0) for w in prefill_workers), default=0)
        if self._completes(len(req.blocks), max(matches.values(), default=0), prefilled):
            direct = self._direct(req, decode_workers, matches, prefilled)
            if direct is not None:
                return Plan(decode=direct)
        first = self._prefill(req, prefill_workers, matches, sticky, index)
        prefill = find(prefill_workers, first.worker)
        second = self.choose_decode(req, partners(decode_workers, prefill), prefill)
        return Plan(decode=second, prefill=first, kv_path=kv_path(prefill, find(decode_workers, second.worker)))


def random_config(rng: random.Random) -> KvAwareConfig:
    cfg = KvAwareConfig()
    roll = rng.random()
    if roll < 0.3:
        return cfg
    if roll < 0.5:
        return cfg.for_blocks(rng.choice([16, 32, 128, 512]))
    return replace(
        cfg,
        direct_below_blocks=rng.choice([0, 1, 4, 8, 12]),
        load_factor=rng.choice([1.0, 1.15, 1.5]),
        load_slack=rng.choice([0.0, 0.5, 1.0, 2.0]),
        stick_blocks=rng.choice([2, 8, 16]),
        stick_factor=rng.choice([2.0, 3.0]),
        stick_share=rng.choice([0.1, 0.2, 0.5]),
        hot_recent=rng.choice([1.0, 1.2, 2.0]),
        work_slack=rng.choice([0.0, 8.0, 64.0]),
        direct_lead_blocks=rng.choice([0, 4, 16]),
        direct_lead_ratio=rng.choice([1.0, 4.0]),
        direct_max_blocks=rng.choice([8, 64]),
        kv_weight=rng.choice([0.0, 4.0]),
        domain_slack=rng.choice([0.0, 2.0]),
    )


def random_worker(rng: random.Random, name: str, role: str, domains: Sequence[str]) -> WorkerState:
    whole = rng.random() < 0.6  # scraped gauges in whole requests, or any float (sums must match to the bit)

    def gauge() -> float:
        return float(rng.randrange(6)) if whole else rng.random() * 5

    return WorkerState(
        name=name,
        role=role,  # type: ignore[arg-type]
        domain=rng.choice(domains),
        rev=rng.choice(["", "", "", "r1", "r2"]),
        waiting=gauge() if rng.random() < 0.5 else 0.0,
        running=gauge() if rng.random() < 0.6 else 0.0,
        kv_usage=rng.choice([0.0, 0.0, rng.random()]),
        inflight=rng.randrange(6) if rng.random() < 0.6 else 0,
        inflight_blocks=rng.randrange(200) if rng.random() < 0.5 else 0,
        peer_inflight=rng.randrange(4) if rng.random() < 0.2 else 0,
        peer_blocks=rng.randrange(100) if rng.random() < 0.2 else 0,
    )


def random_case(
    rng: random.Random,
) -> tuple[RouteRequest, list[WorkerState], list[WorkerState], PrefixIndex, KvAwareConfig, RouterContext]:
    domains = ["", "n1", "n2"]
    n_prefill = rng.choice([0, 1, 2, 3, 4, 6])
    n_decode = rng.choice([1, 2, 3, 4])
    role = "prefill" if n_prefill else "worker"
    prefill = [random_worker(rng, f"http://127.0.0.1:{8100 + i}", "prefill", domains) for i in range(n_prefill)]
    decode = [
        random_worker(rng, f"http://127.0.0.1:{8200 + i}", "decode" if n_prefill else role, domains)
        for i in range(n_decode if n_prefill else rng.choice([1, 2, 3, 5, 8]))
    ]
    size = rng.choice([0, 3, 10, 40, 120])
    base = rng.randrange(1 << 20) * 1000
    blocks = [base + k for k in range(size)]
    index = PrefixIndex()
    for w in prefill + decode:
        if rng.random() < 0.5:
            index.set_capacity(w.name, rng.choice([64, 256, 4096]))
        if size and rng.random() < 0.55:  # a cached prefix of the prompt, ties likely
            index.record(w.name, blocks[: rng.choice([1, size // 4 or 1, size // 2 or 1, size - 1 or 1, size])])
        for _ in range(rng.randrange(3)):  # other prompts: what it took lately
            other = rng.randrange(1 << 20) * 1000 + 500
            index.record(w.name, [other + k for k in range(rng.randrange(1, 60))])
        if rng.random() < 0.2:
            index.fed.add(w.name)
    req = RouteRequest(blocks, rng.randrange(1 << 64), size * 256)
    context = RouterContext(replicas=rng.choice([1, 1, 2, 4]), routes_shared=rng.random() < 0.3)
    workers_order = decode[:]
    rng.shuffle(workers_order)
    return req, prefill, workers_order, index, random_config(rng), context


CASES = 4000


def test_the_composition_chooses_exactly_as_the_sort_tuple_did() -> None:
    rng = random.Random(20260432)
    reasons: Counter[str] = Counter()
    for _ in range(CASES):
        req, prefill, decode, index, cfg, ctx = random_case(rng)
        old = OldKvAware(cfg, ctx.replicas, ctx.routes_shared)
        new = KvAwarePolicy(cfg)
        new.set_context(ctx)
        want = old.plan(req, prefill, decode, index)
        assert new.plan(req, prefill, decode, index) == want
        for hop in (want.prefill, want.decode):
            if hop is not None:
                reasons[hop.reason] += 1
        for pool in (prefill, decode):  # one hop alone, as tests and the benchmarks ask it
            if pool:
                assert new.choose_prefill(req, pool, index) == old.choose_prefill(req, pool, index)
                reasons["prefill:" + old.choose_prefill(req, pool, index).reason] += 1
        anchor = prefill[0] if prefill else None
        assert new.choose_decode(req, decode, anchor, index) == old.choose_decode(req, decode, anchor)
    # every branch of the old rule was exercised, so the equality above covers each
    for reason in ("prefix", "affinity", "spill", "load", "short-prompt", "decode-holds", "same-domain"):
        assert reasons[reason] + reasons["prefill:" + reason] > 0, (reason, reasons)
    assert reasons["least-loaded"] > 0


def test_the_default_scorers_reproduce_the_old_tuple_order() -> None:
    """The ranking alone: the composed order is the old sorted tuple's, position for position."""
    rng = random.Random(7)
    scorers = make_scorers(KvAwareConfig().scorers)
    for _ in range(1000):
        req, prefill, decode, index, _, ctx = random_case(rng)
        workers = prefill or decode
        view = RouteView(req, index, ctx)
        sticky = view.shared
        matches = index.match(req.blocks) if req.blocks else {}
        old = sorted(
            (
                (matches.get(w.name, 0), -index.recent(w.name) if sticky else 0, weight(req.key, w.name), i)
                for i, w in enumerate(workers)
            ),
            reverse=True,
        )
        ranked = rank(view, workers, scorers)
        assert list(ranked.order) == [r[3] for r in old]
        assert list(ranked.hits) == [r[0] for r in old]


def test_weights_scale_a_scorer_off_or_reversed() -> None:
    workers = [WorkerState(name=f"w{i}", role="prefill") for i in range(4)]
    index = PrefixIndex()
    blocks = list(range(10))
    for i, w in enumerate(workers):
        index.record(w.name, blocks[: 2 + 2 * i])  # w3 holds the most
    req = RouteRequest(blocks, key=11)
    view = RouteView(req, index, RouterContext())

    def first(*weights: ScorerWeight) -> str:
        return rank(view, workers, make_scorers(weights)).at(0).name

    assert first(ScorerWeight("prefix")) == "w3"
    assert first(ScorerWeight("prefix", 2.5)) == "w3"  # a positive weight keeps the order
    assert first(ScorerWeight("prefix", -1.0)) == "w0"  # a negative one reverses it
    home = max(workers, key=lambda w: weight(11, w.name)).name
    assert first(ScorerWeight("prefix", 0.0), ScorerWeight("rendezvous")) == home  # 0: off, the next decides


def test_an_unknown_scorer_fails_when_configured() -> None:
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        KvAwarePolicy(KvAwareConfig(scorers=(ScorerWeight("nope"),)))
    assert set(SCORERS) >= {"prefix", "recent", "rendezvous"}
