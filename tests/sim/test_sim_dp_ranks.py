"""Data-parallel replicas in the simulator: one prefix cache per rank, vLLM's rank balancing, rank targets.

A vLLM replica with `--data-parallel-size D` keeps a prefix cache per rank; the router either routes
to each rank (`ranks`: targets `URL#dpR`, the rank pinned) or to the replica, whose API server picks
the rank by load (`engine`). These tests pin what each mode must do and that replicas of one rank
behave exactly as before in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from test_sim_units import _run as run_until_idle  # type: ignore[import-not-found]  # tests/sim on sys.path

from xpyd_router.pool import WorkerSpec, rank_targets
from xpyd_sim import spec as specs
from xpyd_sim.cli import build_parser
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.kvevents import EventBus, EventFedIndex
from xpyd_sim.report import build
from xpyd_sim.request import SimRequest
from xpyd_sim.routing import DP_ROUTINGS, DpRouting, SimRouter
from xpyd_sim.trace import TraceRequest
from xpyd_sim.worker import Worker

BT = 64  # prefix block tokens of these tests' prompts


class FakePerf:
    """Constant step times: these tests are about caches and ranks, not timing."""

    kv_bytes_per_token = 1000
    host_bandwidth = 64e9

    def __init__(self, capacity: int = 64_000) -> None:
        self.kv_capacity_tokens = capacity

    def step_seconds(self, chunks: Sequence[tuple[int, int]], batch: int, ctx_total: int) -> float:
        return 0.01 + 1e-5 * sum(new for new, _ in chunks)

    def decode_step_seconds(self, batch: int, ctx_total: int) -> float:
        return 0.01


def worker(ranks: int, capacity: int = 64_000, cache_tokens: int | None = None) -> Worker:
    perf = FakePerf(capacity)
    return Worker(0, "worker", "node-0", perf, gpus=ranks, block_tokens=BT, ranks=ranks, cache_tokens=cache_tokens)


def serve(w: Worker, req: SimRequest, now: float = 0.0) -> float:
    """Admit one one-hop request and run the worker until it is idle; the time it ends."""
    req.direct = True
    w.admit(req)
    end: float = run_until_idle(w, now)[0]
    return end


def request(rid: int, blocks: Sequence[int], rank: int = -1, output: int = 4) -> SimRequest:
    req = SimRequest(rid, 0.0, len(blocks) * BT + 10, output, tuple(blocks))
    req.prefill_rank = rank
    return req


@pytest.mark.parametrize("ranks", [1, 2, 4, 16])
def test_each_rank_caches_in_its_share_of_the_replicas_kv(ranks: int) -> None:
    w = worker(ranks, capacity=64_000)
    assert len(w.caches) == ranks
    assert {c.capacity for c in w.caches} == {64_000 // ranks // BT}
    assert w.rank_cap == 64_000 // ranks
    assert w.cache is w.caches[0]


@pytest.mark.parametrize(
    ("first_rank", "second_rank", "hit_blocks"),
    [
        (1, 1, 8),  # the same rank: the whole prefix (all but the last token, as vLLM)
        (1, 2, 0),  # another rank's cache does not hold it
        (0, 3, 0),
        (3, 3, 8),
    ],
)
def test_a_prefix_hits_only_on_the_rank_that_cached_it(first_rank: int, second_rank: int, hit_blocks: int) -> None:
    w = worker(4)
    blocks = list(range(100, 108))
    t = serve(w, request(0, blocks, first_rank))
    assert [len(c) for c in w.caches] == [8 if r == first_rank else 0 for r in range(4)]
    again = request(1, [*blocks, 200], second_rank)
    serve(w, again, t)
    assert again.cached_tokens == hit_blocks * BT
    assert w.rank_kv == [0, 0, 0, 0]
    assert w.kv_used == 0


def test_a_rank_evicts_only_its_own_blocks() -> None:
    w = worker(2, cache_tokens=2 * 10 * BT)  # caches of 10 blocks per rank
    t = serve(w, request(0, list(range(100, 108)), 0))
    t = serve(w, request(1, list(range(300, 308)), 1), t)
    t = serve(w, request(2, list(range(500, 508)), 1), t)  # rank 1 needs room: its own old blocks go
    assert len(w.caches[0]) == 8
    assert len(w.caches[1]) == 10
    assert w.caches[1].evictions == 6
    assert w.caches[0].evictions == 0


@pytest.mark.parametrize(
    ("queued", "busy", "want"),
    [
        ([0, 0, 0, 0], [0, 0, 0, 0], 0),  # all equal: the first from rank 0
        ([1, 0, 0, 0], [0, 0, 0, 0], 1),
        ([0, 0, 0, 0], [5, 3, 3, 4], 1),  # the first of the lowest
        ([1, 0, 0, 0], [0, 4, 3, 9], 2),  # 4, 4, 3, 9: a waiting request weighs 4 running ones
        ([0, 1, 0, 0], [4, 0, 5, 5], 0),  # 4, 4, 5, 5
        ([2, 2, 2, 0], [0, 0, 0, 8], 0),  # 8, 8, 8, 8
        ([2, 2, 2, 0], [0, 0, 0, 7], 3),  # 8, 8, 8, 7
    ],
)
def test_the_engine_picks_vllms_rank(queued: list[int], busy: list[int], want: int) -> None:
    """vLLM v0.11 DPLBAsyncMPClient: the lowest waiting * 4 + running, the first such from rank 0."""
    w = worker(4)
    w.rank_queued[:] = queued
    w.rank_busy[:] = busy
    assert w.pick_rank() == want


def test_unpinned_requests_spread_over_the_ranks_and_pinned_ones_stay() -> None:
    w = worker(3)
    ranks = []
    for i in range(4):
        req = request(i, [i + 1])
        w.admit(req)
        ranks.append(req.prefill_rank)
    assert ranks == [0, 1, 2, 0]  # each admitted request waits, weighing 4
    assert w.rank_queued == [2, 1, 1]
    pinned = request(9, [9], rank=2)
    pinned.direct = True
    w.admit(pinned)
    assert (pinned.prefill_rank, pinned.decode_rank) == (2, 2)
    assert w.rank_queued == [2, 1, 2]
    assert sum(w.rank_queued) == w.queued


def test_one_rank_picks_rank_zero() -> None:
    w = worker(1)
    w.rank_queued[0] = 100
    assert w.pick_rank() == 0


DEEPSEEK_DP16 = {
    "apiVersion": "xpyd.io/v1alpha1",
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "ds"},
    "spec": {
        "model": {"name": "deepseek-ai/DeepSeek-R1-0528"},
        "topology": {"kind": "HGX-B200"},
        "engine": {"kind": "vllm", "args": ["--max-model-len", "32768"]},
        "prefill": {"replicas": 1, "gpusPerReplica": 16, "dataParallelSize": 16, "expertParallel": True},
        "decode": {"replicas": 1, "gpusPerReplica": 16, "dataParallelSize": 16, "expertParallel": True},
    },
}


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("ranks", [f"{role}-0#dp{r}" for role in ("prefill", "decode") for r in range(16)]),
        ("engine", ["prefill-0", "decode-0"]),
    ],
)
def test_rank_mode_gives_one_target_per_rank(mode: DpRouting, want: list[str]) -> None:
    sim = Simulation(specs.parse(DEEPSEEK_DP16), [], SimConfig(dp_routing=mode))
    pool = sim.router.pools[0]
    assert sorted(pool.workers) == sorted(want)
    if mode == "ranks":  # named as the product's router names them
        product = [t.url for t in rank_targets(WorkerSpec("prefill-0", "prefill"), 16)]
        assert [n for n in pool.workers if n.startswith("prefill")] == product
    prefill = sim.cluster.workers["prefill"][0]
    assert prefill.ranks == 16
    for name, state in pool.workers.items():
        if name.startswith("prefill"):
            per_target = prefill.caches[0].capacity * (1 if mode == "ranks" else 16)
            assert state.capacity_blocks == per_target


def test_one_rank_replicas_have_one_target_in_both_modes() -> None:
    doc: dict[str, Any] = {**DEEPSEEK_DP16, "spec": {**DEEPSEEK_DP16["spec"]}}  # type: ignore[dict-item]
    doc["spec"]["prefill"] = {"replicas": 2, "gpusPerReplica": 8, "expertParallel": True}
    doc["spec"]["decode"] = {"replicas": 1, "gpusPerReplica": 8, "expertParallel": True}
    for mode in DP_ROUTINGS:
        sim = Simulation(specs.parse(doc), [], SimConfig(dp_routing=mode))
        assert sorted(sim.router.pools[0].workers) == ["decode-0", "prefill-0", "prefill-1"]


@pytest.mark.parametrize(("per_rank", "name"), [(True, "w#dp1"), (False, "w")])
def test_a_ranks_kv_events_feed_its_own_target(per_rank: bool, name: str) -> None:
    w = worker(2)
    w.name = "w"
    bus = EventBus(0.0, per_rank)
    index = EventFedIndex(own=False)
    bus.indexes = [index]
    bus.watch([w])
    serve(w, request(0, [1, 2, 3], rank=1))
    bus.send(w, 1.0)
    assert index.match([1, 2, 3]) == {name: 3}


def test_the_router_refuses_an_unknown_dp_routing() -> None:
    with pytest.raises(ValueError, match="data-parallel routing"):
        SimRouter("kv-aware", 64, dp_routing="sideways")  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "want"), [([], "ranks"), (["--dp-routing", "engine"], "engine")])
def test_cli_dp_routing_option(argv: list[str], want: str) -> None:
    args = build_parser().parse_args(["--spec", "x.yaml", "--trace", "t.jsonl", *argv])
    assert args.dp_routing == want


def test_cli_refuses_an_unknown_dp_routing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--spec", "x.yaml", "--trace", "t.jsonl", "--dp-routing", "any"])
    assert "--dp-routing" in capsys.readouterr().err


def colocated(dp: int) -> dict[str, Any]:
    """Two co-located Llama-3.1-8B replicas on one HGX-B200 node, `dp` ranks of one GPU each."""
    return {
        "apiVersion": "xpyd.io/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": f"dp{dp}"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "mode": "Colocated",
            "topology": {"kind": "HGX-B200"},
            "worker": {"replicas": 2, "gpusPerReplica": dp, "dataParallelSize": dp},
        },
    }


def chat(conversations: int = 48, turns: int = 6) -> list[TraceRequest]:
    """Multi-turn chat under two shared system prompts: turn k's prompt is turn k-1's plus new blocks."""
    out = []
    for c in range(conversations):
        stream = [10_000 + (c % 2) * 100 + j for j in range(16)]  # a 1k-token system prompt
        for k in range(turns):
            stream += [1_000_000 + c * 1000 + k * 10 + j for j in range(6)]
            out.append(TraceRequest(c * 0.1 + k * 4.0, len(stream) * BT + 20, 300, tuple(stream)))
    return sorted(out, key=lambda r: r.arrival)


def run(doc: dict[str, Any], mode: DpRouting, index: str = "events") -> tuple[dict[str, Any], Simulation]:
    cfg = SimConfig(router="kv-aware", router_index=index, block_tokens=BT, dp_routing=mode)  # type: ignore[arg-type]
    sim = Simulation(specs.parse(doc), chat(), cfg)
    sim.run()
    return build(sim, 0.0), sim


@pytest.mark.parametrize("index", ["events", "own"])
def test_routing_to_ranks_beats_the_engines_balancing_on_multi_turn_chat(index: str) -> None:
    ranks, sim = run(colocated(4), "ranks", index)
    engine, _ = run(colocated(4), "engine", index)
    assert ranks["completed"] == engine["completed"] == len(chat())
    # 48 overlapping conversations of 6 turns: with ranks each later turn finds its history (0.82 of
    # the prompt tokens); the engine's balancing sends a busy turn to its conversation's rank about 1
    # time in 4 (0.62: it favours rank 0 when ranks tie, which keeps some turns together)
    assert ranks["prefix_hit_ratio"] > engine["prefix_hit_ratio"] + 0.15, (ranks, engine)
    assert ranks["prefix_hit_ratio"] > 0.75
    for w in sim.cluster.all_workers():  # every rank's books balance at the end
        assert w.rank_queued == [0] * w.ranks
        assert w.rank_busy == [0] * w.ranks
        assert w.rank_kv == [0] * w.ranks
        assert sum(len(c) for c in w.caches) > 0


def test_replicas_of_one_rank_run_the_same_in_both_modes() -> None:
    ranks, _ = run(colocated(1), "ranks")
    engine, _ = run(colocated(1), "engine")
    for key in ("prefix_hit_ratio", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "simulated_s", "router_decisions"):
        assert ranks[key] == engine[key], key
