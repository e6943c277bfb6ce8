"""Engine KV events in the simulator: what a worker's cache reports, when replicas see it, and shared load."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpyd_router.model import RouteRequest
from xpyd_sim import spec as specs
from xpyd_sim import trace
from xpyd_sim.cache import PrefixCache
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.kvevents import EventBus, EventFedIndex
from xpyd_sim.runner import Variant, run_one


@pytest.mark.parametrize(
    ("capacity", "inserts", "want"),
    [
        (10, [[1, 2, 3]], [(True, [1, 2, 3])]),
        (10, [[1, 2, 3], [1, 2, 4]], [(True, [1, 2, 3]), (True, [4])]),  # cached blocks are not stored again
        (4, [[1, 2, 3], [7, 8]], [(True, [1, 2, 3]), (True, [7, 8]), (False, [3])]),  # the tail goes first
    ],
)
def test_prefix_cache_reports_stores_and_evictions(capacity: int, inserts: list[list[int]], want: list[object]) -> None:
    cache = PrefixCache(capacity)
    cache.events = []
    for blocks in inserts:
        cache.insert(blocks)
    cache.match([1, 2])  # a hit reorders the LRU but reports nothing, as vLLM's events
    assert cache.events == want


def test_a_cache_without_a_listener_reports_nothing() -> None:
    cache = PrefixCache(2)
    cache.insert([1, 2, 3])
    assert cache.events is None
    assert len(cache) == 2


class _Cache:
    def __init__(self, events: list[tuple[bool, list[int]]]) -> None:
        self.events = events


class _Worker:
    def __init__(self, name: str, events: list[tuple[bool, list[int]]]) -> None:
        self.name = name
        self.cache = _Cache(events)
        self.caches = [self.cache]  # one rank
        self.tiers: list[_Cache] = []  # no CPU tier


@pytest.mark.parametrize("own", [False, True], ids=["events", "events+own"])
def test_events_reach_every_replica_after_the_delay_in_order(own: bool) -> None:
    bus = EventBus(0.05)
    bus.indexes = [EventFedIndex(own), EventFedIndex(own)]
    for index in bus.indexes:
        index.set_capacity("w", 100)
        index.record("w", [9, 10])  # the routing path's own guess
    worker = _Worker("w", [(True, [1, 2, 3]), (False, [3])])
    assert bus.send(worker, now=1.0) == pytest.approx(1.05)  # type: ignore[arg-type]
    assert worker.cache.events == []
    assert bus.deliver(1.04) == pytest.approx(1.05)
    assert [ix.match([1, 2, 3]) for ix in bus.indexes] == [{}, {}]  # not yet: 50 ms late
    assert bus.deliver(1.05) is None
    for index in bus.indexes:
        assert index.match([1, 2, 3]) == {"w": 2}  # stored, then the tail evicted
        assert index.match([9, 10]) == {"w": 2}  # the routing path's guess stays until the events settle it
        assert (index.fed == {"w"}) is not own  # events: every replica sees the same, so prefixes may stick


def test_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        EventBus(-1.0)


def _run(spec_file: Path, mooncake_file: Path, **config: object) -> dict[str, object]:
    spec = specs.load(spec_file)
    load = list(trace.load(mooncake_file))
    return run_one(Variant("t", spec, SimConfig(autoscaler="off", **config)), load)  # type: ignore[arg-type]


@pytest.mark.parametrize("index", ["own", "events", "events+own"])
def test_every_index_mode_accounts_for_every_request(spec_file: Path, mooncake_file: Path, index: str) -> None:
    res = _run(spec_file, mooncake_file, router_index=index, router_replicas=2, peer_sync_s=0.1)
    assert res["completed"] == res["requests"] == 120
    assert res["unfinished"] == 0


def test_replicas_with_events_and_shared_load_match_one_replica(spec_file: Path, mooncake_file: Path) -> None:
    one = _run(spec_file, mooncake_file, router_index="events", router_replicas=1)
    assert one["prefix_hit_ratio"] > 0.1  # type: ignore[operator]
    for n in (2, 4):
        many = _run(spec_file, mooncake_file, router_index="events", router_replicas=n, peer_sync_s=0.05)
        assert many["prefix_hit_ratio"] == pytest.approx(one["prefix_hit_ratio"], rel=0.02)


def test_shared_load_gives_each_replica_the_others_counts(spec_file: Path) -> None:
    sim = Simulation(specs.load(spec_file), [], SimConfig(router_replicas=3))
    pools = sim.router.pools
    name = next(iter(pools[0].workers))
    for i, pool in enumerate(pools):
        pool.begin(name, 10 * (i + 1))
    sim.router.share_load()
    assert [(p.workers[name].peer_inflight, p.workers[name].peer_blocks) for p in pools] == [(2, 50), (2, 40), (2, 30)]
    assert [p.workers[name].work for p in pools] == [60, 60, 60]


@pytest.mark.parametrize(("sync", "seen"), [(0.1, [True, True, True]), (0.0, [True, False, False])])
def test_replicas_sharing_load_also_pass_on_their_routes(spec_file: Path, sync: float, seen: list[bool]) -> None:
    sim = Simulation(specs.load(spec_file), [], SimConfig(router_replicas=3, peer_sync_s=sync))
    pools = sim.router.pools
    blocks = list(range(500, 520))
    plan = pools[0].route(RouteRequest(blocks, 1, 20 * 256))
    sim.router.share_load()
    assert [bool(p.index.match(blocks).get(plan.decode.worker)) for p in pools] == seen


def test_a_smaller_cache_caps_what_a_worker_keeps(spec_file: Path, mooncake_file: Path) -> None:
    full = _run(spec_file, mooncake_file)
    tiny = _run(spec_file, mooncake_file, cache_tokens=1024)
    assert float(tiny["prefix_hit_ratio"]) < float(full["prefix_hit_ratio"])  # type: ignore[arg-type]
