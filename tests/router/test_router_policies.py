"""Routing policies as pure functions of (request, worker states, prefix index): table-driven cases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from xpyd_router.hashing import weight
from xpyd_router.policy.registry import (
    POLICIES,
    KvAwareConfig,
    KvAwarePolicy,
    NoWorker,
    PrefixIndex,
    RouterContext,
    RouteRequest,
    WorkerState,
    make_policy,
    record,
)

BLOCKS = list(range(100, 140))  # a 40-block prompt


def w(name: str, role: str = "prefill", domain: str = "", **load: float) -> WorkerState:
    return WorkerState(name=name, role=role, domain=domain, **load)  # type: ignore[arg-type]


def index_with(blocks: list[int] = BLOCKS, **cached: int) -> PrefixIndex:
    index = PrefixIndex()
    for name, count in cached.items():
        index.record(name, blocks[:count])
    return index


@dataclass
class Case:
    id: str
    workers: list[WorkerState]
    cached: dict[str, int] = field(default_factory=dict)
    want: str | set[str] = ""
    reason: str = ""
    blocks: list[int] = field(default_factory=lambda: BLOCKS)


FOUR = ["a", "b", "c", "d"]
HOME = max(FOUR, key=lambda n: weight(7, n))  # the rendezvous home of key 7, the cases' key


def pool(**loads: dict[str, float]) -> list[WorkerState]:
    return [w(name, "prefill", "", **loads.get(name, {})) for name in FOUR]


PREFILL_CASES = [
    Case("cache hit wins among equals", [w("a"), w("b"), w("c")], {"b": 30}, "b", "prefix"),
    Case("longest hit wins", [w("a"), w("b")], {"a": 10, "b": 30}, "b", "prefix"),
    Case(
        "a prefix only one worker holds stays there within stick_factor x mean load",
        pool(a={"running": 2}), {"a": 30}, "a", "prefix",
    ),
    Case(
        "and spills once that worker is far busier than the pool",
        pool(a={"running": 8}), {"a": 30}, {"b", "c", "d"}, "spill",
    ),
    Case(
        "the same load moves a prefix too short to stick (the tighter load_factor bound applies)",
        pool(a={"running": 2}), {"a": 6}, {"b", "c", "d"}, "spill",
    ),
    Case(
        "a lead of a fifth of the prompt sticks like a long one (stick_share)",
        pool(a={"running": 2}), {"a": 8}, "a", "prefix",
    ),
    Case(
        "no lead, no stickiness, even for a prompt without a full block",
        pool(**{HOME: {"running": 2.0}}), {}, set(FOUR) - {HOME}, "spill", [],
    ),
    Case(
        "a lead counts over the runner-up, not over nothing",
        pool(a={"running": 2}, b={}), {"a": 30, "b": 26}, {"b", "c", "d"}, "spill",
    ),
    Case(
        "in-flight prompt work bounds a worker too",
        pool(a={"inflight": 1, "inflight_blocks": 400}), {"a": 30}, {"b", "c", "d"}, "spill",
    ),
    Case(
        "other replicas' in-flight work counts like this replica's own",
        pool(a={"peer_inflight": 1, "peer_blocks": 400}), {"a": 30}, {"b", "c", "d"}, "spill",
    ),
    Case("moderate load does not move a held prefix", [w("a", running=2), w("b")], {"a": 40}, "a", "prefix"),
    Case("cold prompt: a rendezvous home", [w("a"), w("b"), w("c")], {}, {"a", "b", "c"}, "affinity"),
    Case("single worker", [w("a", waiting=50)], {}, "a", "load"),
]  # fmt: skip


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: c.id)
def test_kv_aware_prefill(case: Case) -> None:
    decision = KvAwarePolicy().choose_prefill(
        RouteRequest(case.blocks, key=7), case.workers, index_with(case.blocks, **case.cached)
    )
    assert decision.worker in ({case.want} if isinstance(case.want, str) else case.want)
    assert decision.reason == case.reason
    assert decision.matched_blocks == case.cached.get(decision.worker, 0)


@pytest.mark.parametrize("key", range(6))
def test_a_busy_home_spills_to_the_next_worker_in_rendezvous_order(key: int) -> None:
    names = [f"http://127.0.0.1:{8100 + i}" for i in range(5)]
    order = sorted(names, key=lambda n: weight(key, n), reverse=True)
    workers = [w(n, running=9.0 if n == order[0] else 0.0) for n in names]
    decision = KvAwarePolicy().choose_prefill(RouteRequest(BLOCKS, key=key), workers, PrefixIndex())
    assert (decision.worker, decision.reason) == (order[1], "spill")  # the same second home on every replica
    idle = KvAwarePolicy().choose_prefill(RouteRequest(BLOCKS, key=key), [w(n) for n in names], PrefixIndex())
    assert (idle.worker, idle.reason) == (order[0], "affinity")


@pytest.mark.parametrize(
    ("loads", "cached", "want"),
    [
        ({"a": 3, "b": 1, "c": 2, "d": 5}, {}, "b"),  # cold: the least loaded
        ({"a": 3, "b": 1, "c": 2, "d": 5}, {"c": 40}, "c"),  # within the slack (1 request) of it, the one caching most
        ({"a": 3, "b": 1, "c": 3, "d": 5}, {"c": 40}, "b"),  # beyond the slack, load wins
    ],
)
def test_every_worker_over_its_bound_goes_to_the_least_loaded(
    loads: dict[str, float], cached: dict[str, int], want: str
) -> None:
    long = list(range(1000, 3000))  # a prompt larger than the work bound allows anywhere
    workers = [w(name, running=n) for name, n in loads.items()]
    decision = KvAwarePolicy().choose_prefill(RouteRequest(long, key=7), workers, index_with(long, **cached))
    assert (decision.worker, decision.reason) == (want, "load")


@pytest.mark.parametrize(
    ("others_took", "running", "want"),
    [
        (30, 4.0, "a"),  # the holder took no more than the rest lately: the 3x bound keeps it at 4 running
        (0, 4.0, "spill"),  # it took every block lately (a hot spot): the 2x bound moves the prompt
        (0, 2.0, "a"),  # ...but not below that bound
        (30, 7.0, "spill"),  # and the 3x bound holds too
    ],
)
def test_a_hot_holder_keeps_its_prefixes_under_the_tighter_bound(others_took: int, running: float, want: str) -> None:
    index = index_with(a=30)
    for name in "bcd" if others_took else "":  # other prompts' blocks: only the pool's recent intake differs
        index.record(name, list(range(100 * ord(name), 100 * ord(name) + others_took)))
    decision = KvAwarePolicy().choose_prefill(RouteRequest(BLOCKS, key=7), pool(a={"running": running}), index)
    assert (decision.worker if want == "a" else decision.reason) == want


def test_replicas_agree_without_shared_state() -> None:
    workers = [w(f"http://127.0.0.1:{8100 + i}") for i in range(6)]
    picks = set()
    for key in range(30):
        req = RouteRequest(BLOCKS, key=key)
        first = KvAwarePolicy().choose_prefill(req, workers, PrefixIndex()).worker
        second = KvAwarePolicy().choose_prefill(req, list(reversed(workers)), PrefixIndex()).worker
        assert first == second
        picks.add(first)
    assert len(picks) > 1  # different prefixes spread over workers


DECODE_CASES = [
    Case(
        "same NVLink domain preferred",
        [w("d1", "decode", "n1"), w("d2", "decode", "n2")], want="d2", reason="same-domain",
    ),
    Case(
        "same domain accepted while only slightly busier",
        [w("d1", "decode", "n1"), w("d2", "decode", "n2", running=2)], want="d2", reason="same-domain",
    ),
    Case(
        "far busier same-domain worker loses",
        [w("d1", "decode", "n1"), w("d2", "decode", "n2", running=9)], want="d1", reason="least-loaded",
    ),
    Case(
        "KV usage counts as load",
        [w("d1", "decode", "n1", kv_usage=0.95), w("d3", "decode", "n3")], want="d3", reason="least-loaded",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.id)
def test_kv_aware_decode(case: Case) -> None:
    prefill = w("p", "prefill", "n2")
    decision = KvAwarePolicy().choose_decode(RouteRequest(BLOCKS, key=1), case.workers, prefill, PrefixIndex())
    assert (decision.worker, decision.reason) == (case.want, case.reason)


@pytest.mark.parametrize(
    ("blocks", "cached", "threshold", "two_hops", "path"),
    [
        (BLOCKS, 0, 8, True, "nvlink"),
        (BLOCKS[:5], 0, 8, False, "none"),  # short prompt: straight to decode
        (BLOCKS, 36, 8, False, "none"),  # mostly cached on the decode worker: 4 uncached blocks
        (BLOCKS[:5], 0, 0, True, "nvlink"),  # threshold 0: always disaggregate
        ([], 0, 0, True, "nvlink"),
    ],
)
def test_conditional_disaggregation(blocks: list[int], cached: int, threshold: int, two_hops: bool, path: str) -> None:
    policy = KvAwarePolicy(KvAwareConfig(direct_below_blocks=threshold))
    index = PrefixIndex()
    index.record("d", blocks[:cached])
    plan = policy.plan(RouteRequest(blocks, key=3), [w("p", domain="n")], [w("d", "decode", "n")], index)
    assert (plan.prefill is not None) == two_hops
    assert plan.kv_path == path
    assert plan.decode.worker == "d"


D1, D2, SP = {"d1": 34, "d2": 37}, [w("d1", "decode"), w("d2", "decode")], "short-prompt"
DIRECT_CASES = [  # want "": the prompt goes through prefill (reason: the prefill decision's)
    Case("the decode worker holding the most goes first", D2, D1, "d2", SP),
    Case("even when the other is less loaded", [D2[0], w("d2", "decode", running=1)], D1, "d2", SP),
    Case("one over the bound leaves it to the other", [D2[0], w("d2", "decode", running=6)], D1, "d1", SP),
    Case("a full KV cache counts as load", [D2[0], w("d2", "decode", kv_usage=1.0)], D1, "d1", SP),
    Case("both too far: prefill", D2, {"d1": 20, "d2": 30}, "", "prefix"),
    Case("every near one over the bound: prefill", [w("d1", "decode", running=6), D2[1]], {"d1": 36}, "", "prefix"),
]  # fmt: skip


@pytest.mark.parametrize("case", DIRECT_CASES, ids=lambda c: c.id)
def test_short_prompt_goes_to_the_decode_worker_holding_it(case: Case) -> None:
    index = index_with(BLOCKS, p=40, **case.cached)
    plan = KvAwarePolicy().plan(RouteRequest(BLOCKS, key=3), [w("p")], case.workers, index)
    hop = plan.decode if case.want else plan.prefill
    assert (plan.prefill is None) == bool(case.want)
    assert hop is not None and hop.reason == case.reason
    if isinstance(case.want, str) and case.want:
        assert (hop.worker, hop.matched_blocks) == (case.want, case.cached[case.want])


LONG = list(range(1000, 1200))  # a 200-block prompt


@pytest.mark.parametrize(
    ("prompt", "cached", "config", "want"),
    [
        (LONG, {"p": 100, "d1": 180}, {}, "d1"),  # 80 blocks ahead of the prefill pool: 4x the 20 left
        (LONG, {"p": 101, "d1": 180}, {}, ""),  # 79 ahead: under 4x what is left, so prefill
        (LONG, {"p": 20, "d1": 180, "d2": 170}, {}, "d1"),  # the decode worker holding the most
        (BLOCKS, {"d1": 32}, {}, "d1"),  # 8 left, 32 ahead
        (BLOCKS, {"d1": 31}, {}, ""),  # 9 left would need 36 ahead
        (LONG, {"d1": 136}, {"direct_lead_ratio": 1.0}, "d1"),  # 64 left: direct_max_blocks
        (LONG, {"d1": 135}, {"direct_lead_ratio": 1.0}, ""),  # 65 left: too much prefill for a decode worker
        (LONG, {"d1": 150}, {"direct_lead_ratio": 1.0, "direct_max_blocks": 100}, "d1"),
        (BLOCKS, {"d1": 38}, {"direct_below_blocks": 1}, "d1"),  # 2 left, 38 ahead
        (BLOCKS, {"p": 23, "d1": 38}, {"direct_below_blocks": 1}, ""),  # 15 ahead: under direct_lead_blocks
        (LONG, {"d1": 180}, {"direct_lead_blocks": 0}, ""),  # the lead rule off
        (LONG, {"d1": 180}, {"direct_below_blocks": 0}, ""),  # never straight to decode
    ],
)
def test_decode_worker_holding_a_lead_computes_the_rest(
    prompt: list[int], cached: dict[str, int], config: dict[str, Any], want: str
) -> None:
    index = index_with(prompt, **cached)
    plan = KvAwarePolicy(KvAwareConfig(**config)).plan(
        RouteRequest(prompt, key=3), [w("p")], [w("d1", "decode"), w("d2", "decode")], index
    )
    assert (plan.prefill is None) == bool(want)
    if want:
        assert (plan.decode.worker, plan.decode.reason, plan.decode.matched_blocks) == (
            want,
            "decode-holds",
            cached[want],
        )


def test_decode_worker_over_the_load_bound_leaves_the_prompt_to_prefill() -> None:
    index = index_with(BLOCKS, d1=32)
    busy = [w("d1", "decode", running=6), w("d2", "decode")]
    plan = KvAwarePolicy().plan(RouteRequest(BLOCKS, key=3), [w("p")], busy, index)
    assert plan.prefill is not None and plan.prefill.worker == "p"


def test_plan_records_blocks_for_both_hops_and_rdma_across_domains() -> None:
    policy = KvAwarePolicy(KvAwareConfig(direct_below_blocks=0))
    index = PrefixIndex()
    req = RouteRequest(BLOCKS, key=3)
    plan = policy.plan(req, [w("p", domain="n1")], [w("d", "decode", "n2")], index)
    assert plan.kv_path == "rdma"
    record(index, plan, req)
    assert index.match(BLOCKS) == {"p": 40, "d": 40}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_routes_and_reports_missing_pools(name: str) -> None:
    policy = make_policy(name)
    req = RouteRequest(BLOCKS, key=5)
    plan = policy.plan(req, [w("p1"), w("p2")], [w("d1", "decode")], PrefixIndex())
    assert plan.decode.worker == "d1"
    assert plan.prefill is not None
    assert plan.prefill.worker in {"p1", "p2"}
    one_hop = policy.plan(req, [], [w("c1", "worker"), w("c2", "worker")], PrefixIndex())
    assert one_hop.prefill is None
    assert one_hop.decode.worker in {"c1", "c2"}
    with pytest.raises(NoWorker, match="no ready decode worker"):
        policy.plan(req, [w("p1")], [], PrefixIndex())
    with pytest.raises(NoWorker, match="prefill"):
        policy.choose_prefill(req, [], PrefixIndex())


def test_unknown_policy_is_named() -> None:
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        make_policy("fastest")


def test_round_robin_cycles_each_pool() -> None:
    policy = make_policy("round-robin")
    workers = [w("b"), w("a"), w("c")]
    picks = [policy.choose_prefill(RouteRequest([], 0), workers, PrefixIndex()).worker for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]


def test_least_loaded_picks_least_load() -> None:
    decision = make_policy("least-loaded").choose_prefill(
        RouteRequest([], 0), [w("a", running=3), w("b", inflight=1), w("c", waiting=2)], PrefixIndex()
    )
    assert decision.worker == "b"


def rev(name: str, role: str, engine: str, **load: float) -> WorkerState:
    worker = w(name, role, "", **load)
    worker.rev = engine
    return worker


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(
    ("prefill", "decode", "want_prefill", "want_decode"),
    [
        # mid-upgrade: decode already on v2 for d2; the v1 prefill pairs only with the v1 decode
        ([("p1", "v1")], [("d1", "v1"), ("d2", "v2")], {"p1"}, {"d1"}),
        # prefill p2 (v2) pairs with d2 (v2) only; p1 (v1) with d1
        ([("p2", "v2")], [("d1", "v1"), ("d2", "v2")], {"p2"}, {"d2"}),
        # no decode of the prefill's engine: one hop straight to decode, no cross-version handoff
        ([("p1", "v1")], [("d2", "v2")], None, {"d2"}),
        # unknown revisions (static URLs) pair with anything
        ([("p1", "")], [("d1", "v1")], {"p1"}, {"d1"}),
    ],
)
def test_kv_moves_only_between_workers_of_one_engine_revision(
    name: str,
    prefill: list[tuple[str, str]],
    decode: list[tuple[str, str]],
    want_prefill: set[str] | None,
    want_decode: set[str],
) -> None:
    policy = KvAwarePolicy(KvAwareConfig(direct_below_blocks=0)) if name == "kv-aware" else make_policy(name)
    for key in range(8):
        plan = policy.plan(
            RouteRequest(BLOCKS, key=key),
            [rev(n, "prefill", r) for n, r in prefill],
            [rev(n, "decode", r, running=float(i)) for i, (n, r) in enumerate(decode)],
            PrefixIndex(),
        )
        chosen = plan.prefill.worker if plan.prefill else None
        assert chosen in want_prefill if want_prefill is not None else chosen is None
        assert plan.decode.worker in want_decode


@pytest.mark.parametrize(
    ("tokens_per_block", "stick", "work", "direct"),
    [(64, 16, 64.0, (8, 16, 64)), (16, 64, 256.0, (32, 64, 256)), (512, 2, 8.0, (1, 2, 8))],
)
def test_block_counts_follow_the_block_size(
    tokens_per_block: int, stick: int, work: float, direct: tuple[int, int, int]
) -> None:
    cfg = KvAwareConfig().for_blocks(tokens_per_block)
    assert (cfg.stick_blocks, cfg.work_slack) == (stick, work)
    assert (cfg.direct_below_blocks, cfg.direct_lead_blocks, cfg.direct_max_blocks) == direct
    assert KvAwareConfig(direct_below_blocks=0).for_blocks(16).direct_below_blocks == 0  # never stays never
    assert KvAwareConfig(direct_lead_blocks=0).for_blocks(16).direct_lead_blocks == 0


@pytest.mark.parametrize(
    ("replicas", "fed", "routes", "want", "reason"),
    [
        (1, False, False, "a", "prefix"),  # one router: its own routes are the whole picture, the prefix sticks
        (2, False, False, None, "spill"),  # replicas with private indexes: load alone decides
        (2, True, False, "a", "prefix"),  # replicas sharing the engines' KV events stick again
        (2, False, True, "a", "prefix"),  # replicas passing each other their routes too
    ],
)
def test_stickiness_needs_an_index_the_replicas_share(
    replicas: int, fed: bool, routes: bool, want: str | None, reason: str
) -> None:
    policy = KvAwarePolicy()
    policy.set_context(RouterContext(replicas=replicas, routes_shared=routes))
    index = index_with(BLOCKS, a=30)
    if fed:
        for name in FOUR:
            index.fed.add(name)
    decision = policy.choose_prefill(RouteRequest(BLOCKS, key=3), pool(a={"running": 2.0}), index)
    assert decision.reason == reason
    if want is not None:
        assert decision.worker == want
    else:
        assert decision.worker != "a"


@pytest.mark.parametrize(
    ("replicas", "fed", "want"),
    [
        (1, False, "least-taken"),  # one router: its index is the whole picture
        (2, True, "least-taken"),  # replicas fed the same engine events
        (2, False, "home"),  # private indexes differ between replicas: the rendezvous home alone
    ],
)
def test_equal_prefixes_go_to_the_worker_that_took_least_where_replicas_see_the_same(
    replicas: int, fed: bool, want: str
) -> None:
    index = PrefixIndex()
    other = [n for n in FOUR if n != HOME]
    for i, name in enumerate(FOUR):  # all hold the shared 4-block head; the home the most besides
        index.record(name, BLOCKS[:4])
        index.record(name, [1000 * (i + 1) + j for j in range(50 if name == HOME else 10 + i)])
    least = min(other, key=index.recent)
    if fed:
        index.fed.update(FOUR)
    policy = KvAwarePolicy()
    policy.set_context(RouterContext(replicas=replicas))
    decision = policy.choose_prefill(RouteRequest(BLOCKS, key=7), pool(), index)
    assert decision.worker == (least if want == "least-taken" else HOME)
    assert decision.reason == "prefix"
