"""The CPU KV tier as the router sees it: KV events with medium CPU, the per-worker tier index, what a
reload is worth against a recompute, and the `tiers` scorer that counts a CPU-held block by it."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from xpyd_perf import GPUS, MODELS
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.tier_cost import ReloadCost
from xpyd_router.kv.tier_index import TierIndex
from xpyd_router.kv.wire import CPU, GPU, Removed, Stored, decode_batch
from xpyd_router.model import Plan, RouterContext, RouteRequest, WorkerState
from xpyd_router.policy.base import first_hop_blocks
from xpyd_router.policy.kv import KvAwarePolicy
from xpyd_router.policy.parts import RouteView
from xpyd_router.policy.scorers.prefix import PrefixScorer
from xpyd_router.policy.scorers.tiers import TierScorer

LLAMA = MODELS["llama-3.1-70b"]
TOKENS = list(range(1000, 1064))  # four 16-token blocks


def _stored(hashes: list[int], parent: int | None, medium: str | None, tokens: list[int] | None = None) -> list[object]:
    """A BlockStored as vLLM tags it: block_hashes, parent, token_ids, block_size, lora_id, medium."""
    return ["BlockStored", hashes, parent, TOKENS[: 16 * len(hashes)] if tokens is None else tokens, 16, None, medium]


def _batch(*events: list[object]) -> bytes:
    return msgspec.msgpack.encode([0.0, list(events), 0])


@pytest.mark.parametrize(
    ("medium", "kept"),
    [(None, GPU), ("GPU", GPU), ("CPU", CPU), ("cpu", CPU), ("DISK", None), ("LMCACHE", None)],
)
def test_a_stored_blocks_medium_names_its_tier(medium: str | None, kept: str | None) -> None:
    got = decode_batch(_batch(_stored([1, 2], None, medium)))
    assert [e.medium for e in got if isinstance(e, Stored)] == ([kept] if kept else [])


def test_removals_of_two_tiers_stay_apart_and_runs_of_one_are_merged() -> None:
    got = decode_batch(
        _batch(["BlockRemoved", [1], "GPU"], ["BlockRemoved", [2], "GPU"], ["BlockRemoved", [3], "CPU"],
               ["BlockRemoved", [4], "DISK"])
    )  # fmt: skip
    assert got == [Removed([1, 2], GPU), Removed([3], CPU)]


def _view() -> tuple[PrefixIndex, EngineView]:
    index = PrefixIndex()
    return index, EngineView("w", index, 16)


def test_a_block_offloaded_then_evicted_from_the_gpu_stays_findable_on_the_cpu_tier() -> None:
    index, view = _view()
    view.apply(decode_batch(_batch(_stored([11, 12, 13, 14], None, None))))
    keys = [view.blocks[h] & ((1 << 64) - 1) for h in (11, 12, 13, 14)]
    assert index.match(keys) == {"w": 4}
    # the offloading connector copies the last two to host memory (GPU hashes, no tokens), then the
    # GPU evicts them: the GPU tier ends at two blocks, the CPU tier continues the prompt from there
    view.apply(decode_batch(_batch(_stored([13, 14], None, "CPU", tokens=[]),
                                   ["BlockRemoved", [14], "GPU"], ["BlockRemoved", [13], "GPU"])))  # fmt: skip
    assert index.match(keys) == {"w": 2}
    assert index.offloaded.run("w", keys, 2) == 2
    assert view.stats.offloaded == 2
    # the CPU tier evicts one: the run stops at the other; a block the tier never held is skipped
    view.apply(decode_batch(_batch(["BlockRemoved", [14, 99], "CPU"])))
    assert index.offloaded.run("w", keys, 2) == 1
    view.reset()
    assert index.offloaded.blocks_of("w") == 0 and index.blocks_of("w") == 0


def test_an_offload_of_blocks_the_gpu_never_reported_is_counted_as_orphans() -> None:
    index, view = _view()
    view.apply([Stored([7, 8], None, [], 16, None, CPU)])
    assert view.stats.orphans == 2 and index.offloaded.blocks_of("w") == 0


def test_a_removed_worker_leaves_nothing_in_the_cpu_tier() -> None:
    index = PrefixIndex()
    index.store("w", [1, 2])
    index.offload("w", [3, 4])
    assert index.offloaded.run("w", [1, 2, 3, 4], 2) == 2
    index.remove_worker("w")
    assert index.offloaded.run("w", [1, 2, 3, 4], 2) == 0 and not index.offloaded


@pytest.mark.parametrize(
    ("held", "blocks", "start", "run"),
    [
        ({1, 2, 3}, [1, 2, 3], 0, 3),
        ({2, 3}, [1, 2, 3], 1, 2),
        ({1, 3}, [1, 2, 3], 0, 1),  # a gap ends the run: block 3 cannot be used without block 2
        ({1, 2, 3}, [1, 2, 3], 3, 0),
        (set(), [1, 2, 3], 0, 0),
    ],
)
def test_the_cpu_run_is_the_unbroken_stretch_after_the_gpu_prefix(
    held: set[int], blocks: list[int], start: int, run: int
) -> None:
    tiers = TierIndex()
    tiers.store("w", held)
    assert tiers.run("w", blocks, start) == run
    assert tiers.run("other", blocks, start) == 0


def test_a_cpu_block_is_worth_nothing_without_pricing_and_block_size_must_be_positive() -> None:
    tiers = TierIndex()
    assert tiers.worth(0, 8) == 0.0
    tiers.price(ReloadCost(LLAMA, GPUS["B200"], tp=8), 16)
    assert 0.0 < tiers.worth(0, 8) <= 1.0
    assert tiers.worth(0, 0) == 0.0
    with pytest.raises(ValueError, match="block_tokens"):
        tiers.price(None, 0)


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-8b", 1), ("llama-3.1-70b", 8), ("deepseek-v3", 8)])
def test_a_reload_over_nvlink_c2c_is_worth_more_than_over_pcie(model: str, tp: int) -> None:
    spec = MODELS[model]
    pcie, c2c = ReloadCost(spec, GPUS["B200"], tp), ReloadCost(spec, GPUS["GB200"], tp)
    assert GPUS["GB200"].host_bandwidth > GPUS["B200"].host_bandwidth
    for start, tokens in ((0, 256), (8192, 4096), (49152, 1024)):
        assert 0.0 < pcie.worth(start, tokens) < c2c.worth(start, tokens) <= 1.0
        assert pcie.reload_seconds(tokens) == pytest.approx(2 * pcie.reload_seconds(tokens // 2))


def test_a_reload_slower_than_the_recompute_is_worth_nothing() -> None:
    crawl = replace(GPUS["B200"], host_bandwidth=1e6)  # a host link of 1 MB/s
    cost = ReloadCost(LLAMA, crawl, 8)
    assert cost.reload_seconds(1024) > cost.recompute_seconds(0, 1024)
    assert cost.worth(0, 1024) == 0.0
    assert cost.worth(0, 0) == 0.0


@pytest.mark.parametrize(
    ("tp", "host", "match"), [(0, 64e9, "tp >= 1"), (1, 0.0, "no host link bandwidth")]
)  # fmt: skip
def test_reload_pricing_refuses_what_it_cannot_price(tp: int, host: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReloadCost(LLAMA, replace(GPUS["H200"], host_bandwidth=host), tp)


def _scores(index: PrefixIndex, blocks: list[int]) -> tuple[list[float], list[float]]:
    view = RouteView(RouteRequest(blocks, 1), index, RouterContext())
    workers = [WorkerState("a", "prefill"), WorkerState("b", "prefill"), WorkerState("c", "prefill")]
    return list(TierScorer().score(view, workers)), list(PrefixScorer().score(view, workers))


def test_the_tier_scorer_counts_gpu_blocks_whole_and_cpu_blocks_by_their_reload() -> None:
    blocks = list(range(1, 9))
    index = PrefixIndex()
    index.store("a", blocks[:3])  # 3 on the GPU
    index.store("b", blocks[:2])  # 2 on the GPU, 5 more on the CPU
    index.offload("b", blocks[2:7])
    index.offload("c", blocks[:4])  # only on the CPU: the run starts at block 0
    tiers, prefix = _scores(index, blocks)
    assert tiers == prefix == [3, 2, 0]  # no pricing: exactly the prefix scorer
    index.offloaded.price(ReloadCost(LLAMA, GPUS["GB200"], 8), 16)
    tiers, _ = _scores(index, blocks)
    w5, w4 = index.offloaded.worth(2, 5), index.offloaded.worth(0, 4)
    assert tiers == pytest.approx([3, 2 + 5 * w5, 4 * w4])
    assert tiers[1] > tiers[0]  # 2 GPU + 5 CPU blocks beat 3 GPU blocks where a reload pays


def test_the_router_prices_cpu_blocks_from_its_flags() -> None:
    from xpyd_router.cli import parser, validate

    flags = ["--cpu-tier-gpu", "GB200", "--cpu-tier-model", "meta-llama/Llama-3.1-70B-Instruct", "--cpu-tier-tp", "4"]
    args = parser().parse_args(["--decode", "http://127.0.0.1:9", *flags])
    assert validate(args) is None
    assert args.cpu_tier == ReloadCost(LLAMA, GPUS["GB200"], 4)
    assert parser().parse_args(["--decode", "http://127.0.0.1:9"]).scorers.startswith("tiers,")


@pytest.mark.parametrize(
    ("fixed", "priced", "want"),
    [
        (0.4, False, [3, 2 + 5 * 0.4, 4 * 0.4]),  # llm-d's rule: every CPU-held block at 0.4
        (0.4, True, [3, 2 + 5 * 0.4, 4 * 0.4]),  # a fixed weight replaces the pricing
        (1.0, False, [3, 7, 4]),  # a CPU-held block counted as a GPU-held one
    ],
)
def test_a_fixed_cpu_weight_counts_every_cpu_block_alike(fixed: float, priced: bool, want: list[float]) -> None:
    blocks = list(range(1, 9))
    index = PrefixIndex()
    index.store("a", blocks[:3])
    index.store("b", blocks[:2])
    index.offload("b", blocks[2:7])
    index.offload("c", blocks[:4])
    pricing = ReloadCost(LLAMA, GPUS["GB200"], 8) if priced else None
    index.offloaded.price(pricing, 16, fixed)
    assert index.offloaded.counted
    tiers, _ = _scores(index, blocks)
    assert tiers == pytest.approx(want)
    assert index.offloaded.worth(2, 0) == 0.0  # no CPU run: nothing to weigh


@pytest.mark.parametrize("fixed", [0.0, -0.4, 1.01])
def test_a_fixed_cpu_weight_outside_0_1_is_refused(fixed: float) -> None:
    with pytest.raises(ValueError, match="fixed CPU-block weight"):
        TierIndex().price(None, 16, fixed)


@pytest.mark.parametrize(("argv", "weight"), [([], None), (["--cpu-tier-weight", "0.4"], 0.4)])
def test_the_router_takes_a_fixed_cpu_weight_from_its_flag(argv: list[str], weight: float | None) -> None:
    from xpyd_router.cli import parser, validate

    args = parser().parse_args(["--decode", "http://127.0.0.1:9", *argv])
    assert validate(args) is None
    assert args.cpu_tier_weight == weight


def _busy_holder(pricing: ReloadCost | None, fixed: float | None) -> tuple[PrefixIndex, list[WorkerState], list[int]]:
    """Worker "a" holds the whole 64-block prompt in host memory and has 100 uncached blocks of work in
    flight; "b" holds nothing and is idle."""
    blocks = list(range(1, 65))
    index = PrefixIndex()
    index.offload("a", blocks)
    index.offloaded.price(pricing, 16, fixed)
    return index, [WorkerState("a", "prefill", inflight_blocks=100), WorkerState("b", "prefill")], blocks


@pytest.mark.parametrize(
    ("priced", "fixed", "worker", "saved"),
    [
        (True, None, "a", 64),  # the reload saves nearly all of the prompt: the holder is within its work bound
        (False, 0.4, "b", 0),  # llm-d's weight ranks the holder first but prices nothing: 164 blocks > the bound
        (False, None, "b", 0),  # CPU blocks count nothing: the idle worker
    ],
)  # fmt: skip
def test_a_priced_reload_is_work_the_request_does_not_bring(
    priced: bool, fixed: float | None, worker: str, saved: int
) -> None:
    pricing = ReloadCost(LLAMA, GPUS["GB200"], 8) if priced else None
    index, workers, blocks = _busy_holder(pricing, fixed)
    req = RouteRequest(blocks, 1)
    decision = KvAwarePolicy().pick_prefill(RouteView(req, index, RouterContext()), workers)
    assert decision.worker == worker
    assert decision.saved_blocks == pytest.approx(saved, abs=3)  # the reload's worth is just under 1
    assert first_hop_blocks(Plan(decision), req) == len(blocks) - decision.saved_blocks
