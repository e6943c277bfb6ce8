"""The CPU KV tier in the simulator: blocks the GPU cache evicts move to host memory, a prompt whose
prefix continues there reloads it over the host link instead of recomputing it, and the tier's changes
reach the router's index as KV events with medium CPU (as vLLM's offloading connector sends them)."""

from __future__ import annotations

from typing import Any

import pytest
from test_sim_dp_ranks import BT, chat, request, serve, worker  # type: ignore[import-not-found]

from xpyd_sim import spec as specs
from xpyd_sim.cache import CpuTier, PrefixCache
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.kvevents import EventBus, EventFedIndex
from xpyd_sim.report import build
from xpyd_sim.worker import Worker


def test_the_tier_keeps_what_the_gpu_evicts_in_lru_order_and_reports_it() -> None:
    tier = CpuTier(4)
    tier.events = []
    cache = PrefixCache(3, spill=tier)
    cache.events = []
    cache.insert([1, 2, 3])
    cache.trim(1)  # the GPU keeps the head: the tail goes first (3, then 2), to host memory
    assert len(cache) == 1 and 1 in cache and len(tier) == 2 and 2 in tier and 3 in tier
    tier.put([5, 6, 7])  # one past capacity: the coldest (3) goes, reported removed
    assert tier.events == [(True, [3, 2]), (True, [5, 6, 7]), (False, [3])]
    assert tier.evictions == 1 and 3 not in tier
    tier.put([2])  # a block it holds becomes its most recent, and reports nothing new
    assert tier.events[-1] == (False, [3])
    assert tier.run([1, 2, 5, 6, 3], 1) == 3  # blocks 2, 5, 6 after the GPU's head; 3 is gone


def test_a_negative_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="CPU tier capacity"):
        CpuTier(-1)


def _tiered(cpu_blocks: int) -> Worker:
    w = worker(1, cache_tokens=10 * BT)  # a GPU prefix cache of 10 blocks
    return Worker(0, "worker", "node-0", w.perf, gpus=1, block_tokens=BT, cache_tokens=10 * BT, cpu_blocks=cpu_blocks)


@pytest.mark.parametrize(("cpu_blocks", "reloaded_blocks"), [(0, 0), (4, 4), (64, 8)])
def test_a_prefix_evicted_to_the_cpu_tier_is_reloaded_not_recomputed(cpu_blocks: int, reloaded_blocks: int) -> None:
    w = _tiered(cpu_blocks)
    doc = list(range(100, 108))
    t = serve(w, request(0, doc))
    t = serve(w, request(1, list(range(300, 310))), t)  # fills the GPU cache: the document's blocks move out
    again = request(2, [*doc, 999])
    serve(w, again, t)
    assert again.reloaded_tokens == reloaded_blocks * BT
    assert w.reloaded == reloaded_blocks * BT
    assert again.cached_tokens >= again.reloaded_tokens


def test_a_reloaded_prefix_is_not_computed_and_its_prefill_waits_for_the_host_link() -> None:
    # The same request after the same history, with and without a tier: the reloaded run is not
    # computed (fewer prefill tokens), and the request's prefill starts only when its KV has arrived.
    tiered, plain = _tiered(64), _tiered(0)
    doc = list(range(100, 108))
    got = []
    for w in (tiered, plain):
        t = serve(w, request(0, doc))
        t = serve(w, request(1, list(range(300, 310))), t)
        again = request(2, [*doc, 999])
        serve(w, again, t)
        got.append(again)
    assert got[0].reloaded_tokens > 0 and got[1].reloaded_tokens == 0
    assert got[0].ready > got[0].arrival
    assert got[0].cached_tokens > got[1].cached_tokens


def test_the_tiers_events_reach_the_index_with_medium_cpu() -> None:
    w = _tiered(64)
    w.name = "w"
    bus = EventBus(0.0, per_rank=False)
    index = EventFedIndex(own=False)
    bus.indexes = [index]
    bus.watch([w])
    doc = list(range(100, 108))
    t = serve(w, request(0, doc))
    serve(w, request(1, list(range(300, 310))), t)
    bus.send(w, 1e9)
    bus.deliver(1e9)
    held = index.offloaded.run("w", doc, 0) + index.match(doc).get("w", 0)
    assert index.offloaded.blocks_of("w") > 0
    assert held == len(doc)  # every block of the document is on one tier or the other


LLAMA_8B: dict[str, Any] = {
    "apiVersion": "xpyd.io/v1alpha1",
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "tiers"},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "mode": "Colocated",
        "topology": {"kind": "HGX-B200"},
        "worker": {"replicas": 2, "gpusPerReplica": 1},
    },
}


def test_a_working_set_past_the_gpu_cache_hits_more_with_a_cpu_tier() -> None:
    def run(offload: int) -> dict[str, Any]:
        cfg = SimConfig(router="kv-aware", block_tokens=BT, cache_tokens=40 * BT, offload_bytes=offload)
        sim = Simulation(specs.parse(LLAMA_8B), chat(), cfg)
        sim.run()
        return build(sim, 0.0)

    gpu_only, tiered = run(0), run(64 << 30)
    assert gpu_only["completed"] == tiered["completed"] == len(chat())
    assert tiered["prefix_hit_ratio"] > gpu_only["prefix_hit_ratio"] + 0.1, (gpu_only, tiered)
