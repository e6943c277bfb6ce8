"""A data-parallel replica whose engine picks the rank: one routing target that hears every rank's KV events.

vLLM and SGLang publish each data-parallel rank's events on the configured ports + its global rank
(vLLM `ZmqEventPublisher.offset_endpoint_port` with `data_parallel_index`, SGLang
`select_kv_publisher_dp_rank`), rank r on pod r // local of a multi-node replica. The router, which
does not pin ranks in this mode, subscribes to all of them and keeps one picture per replica.
"""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

import pytest
from test_router_discovery_groups import LEADER_PORTS, group, single, with_dp  # type: ignore[import-not-found]

from xpyd_api import labels
from xpyd_emulator.kv_events import KvEventsConfig
from xpyd_emulator.kv_publisher import ZmqPublisher
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.tokens import block_hashes_text, token_ids
from xpyd_router.cli import parser, static_workers
from xpyd_router.discovery import workers_of
from xpyd_router.kv.block_keys import RequestKeys
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.replica_index import RankIndex
from xpyd_router.kv_events import KvEventHub
from xpyd_router.policy.registry import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec
from xpyd_router.scrape import WorkerMetrics
from xpyd_router.targets import replica_endpoints
from xpyd_router.tokens.engine import EmulatorTokenizer

KEYS = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
TEXTS = ["You are a helpful assistant. Answer briefly. " * 12, "A quite different system prompt here. " * 14]


@pytest.mark.parametrize(
    ("endpoint", "size", "local", "hosts", "want"),
    [
        ("tcp://10.0.0.1:5557", 1, 1, [], "tcp://10.0.0.1:5557"),
        ("", 4, 4, [], ""),
        ("tcp://10.0.0.1:5557", 4, 4, [], "tcp://10.0.0.1:5557 tcp://10.0.0.1:5558 tcp://10.0.0.1:5559 tcp://10.0.0.1:5560"),
        ("tcp://10.0.0.1:5557", 4, 2, ["10.0.0.1", "10.0.0.2"],  # global rank: the port + r on pod r // local
         "tcp://10.0.0.1:5557 tcp://10.0.0.1:5558 tcp://10.0.0.2:5559 tcp://10.0.0.2:5560"),
        ("tcp://10.0.0.1:5657", 2, 1, ["fd00::1", "fd00::2"], "tcp://[fd00::1]:5657 tcp://[fd00::2]:5658"),
    ],
)  # fmt: skip
def test_every_ranks_socket(endpoint: str, size: int, local: int, hosts: list[str], want: str) -> None:
    assert replica_endpoints(endpoint, size, local, hosts) == want


def _engine_mode(pods: list[Any]) -> list[Any]:
    pods[0].metadata.annotations[labels.DATA_PARALLEL_ROUTING] = "engine"
    return pods


def test_a_data_parallel_group_the_engine_balances_is_one_target_with_every_ranks_events() -> None:
    [target] = workers_of(_engine_mode(with_dp(group(n=2), size=4, local=2)))
    assert target.url == "http://127.0.1.1:8000"
    assert target.kv_events.split() == [
        "tcp://127.0.1.1:5557", "tcp://127.0.1.1:5558", "tcp://127.0.1.2:5559", "tcp://127.0.1.2:5560",
    ]  # fmt: skip
    assert target.kv_replay.split()[3] == "tcp://127.0.1.2:5660"


@pytest.mark.parametrize(
    ("annotations", "urls", "sockets"),
    [
        ({labels.DATA_PARALLEL_SIZE: "4", labels.DATA_PARALLEL_ROUTING: "engine"}, 1, 4),
        ({labels.DATA_PARALLEL_SIZE: "4", labels.DATA_PARALLEL_ROUTING: "ranks"}, 4, 1),
        ({labels.DATA_PARALLEL_SIZE: "4"}, 4, 1),  # operators that annotate only the sizes route to ranks
        ({labels.DATA_PARALLEL_SIZE: "1", labels.DATA_PARALLEL_ROUTING: "engine"}, 1, 1),
        ({labels.DATA_PARALLEL_ROUTING: "engine"}, 1, 1),
    ],
)
def test_single_pod_replicas_by_routing_mode(annotations: dict[str, str], urls: int, sockets: int) -> None:
    pod = single("p-0", "127.0.9.1")
    pod.spec.containers[0].ports = LEADER_PORTS
    pod.metadata.annotations = annotations
    targets = workers_of([pod])
    assert len(targets) == urls
    assert {len(t.kv_events.split()) for t in targets} == {sockets}


@pytest.mark.parametrize(
    ("flags", "urls", "sockets"),
    [
        (["--data-parallel-size", "4", "--data-parallel-routing", "engine"], ["http://127.0.0.1:8000"], 4),
        (["--data-parallel-size", "2"], ["http://127.0.0.1:8000#dp0", "http://127.0.0.1:8000#dp1"], 1),
    ],
)
def test_static_workers_by_routing_mode(flags: list[str], urls: list[str], sockets: int) -> None:
    args = parser().parse_args(["--worker", "http://127.0.0.1:8000", "--kv-events-port", "5557", *flags])
    specs = static_workers(args)
    assert [s.url for s in specs] == urls
    assert {len(s.kv_events.split()) for s in specs} == {sockets}


@pytest.mark.parametrize(
    ("steps", "held"),
    [  # (rank, "confirm" | "discard" | "clear", keys) in order -> what the worker holds
        ([(0, "confirm", [1, 2]), (1, "confirm", [2, 3])], {1, 2, 3}),  # the union of the ranks
        ([(0, "confirm", [1, 2]), (1, "confirm", [2]), (0, "discard", [2])], {1, 2}),  # rank 1 still has 2
        ([(0, "confirm", [1, 2]), (1, "confirm", [2]), (0, "discard", [2]), (1, "discard", [2])], {1}),
        ([(0, "confirm", [1, 2]), (1, "confirm", [2, 3]), (0, "clear", [])], {2, 3}),  # a rank restarts
        ([(0, "confirm", [1]), (0, "confirm", [1]), (1, "confirm", [1]), (0, "discard", [1])], {1}),
        ([(1, "discard", [9])], set()),  # a rank's removal of what it never reported
    ],
)  # fmt: skip
def test_a_replicas_entry_is_what_any_rank_holds(steps: list[tuple[int, str, list[int]]], held: set[int]) -> None:
    index, shared = PrefixIndex(), dict[int, int]()
    ranks = [RankIndex(index, shared), RankIndex(index, shared)]
    for r, op, keys in steps:
        if op == "clear":
            ranks[r].clear("w")
        else:
            getattr(ranks[r], op)("w", keys)
    assert {k for k in range(10) if index.match([k]).get("w")} == held


def _free_run(n: int) -> int:
    for _ in range(50):
        base = random.randint(20_000, 60_000)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


async def _until(check: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_every_ranks_events_feed_the_one_replica_worker() -> None:
    """Two ranks published as the emulator (and vLLM) does, each on the port + rank; the router
    routes to the replica and its index holds what either rank cached."""
    events, replay = _free_run(2), _free_run(2)
    config = KvEventsConfig(f"tcp://*:{events}", f"tcp://*:{replay}", topic="kv-events")
    publishers = [ZmqPublisher(config, "127.0.0.1", 16, rank=r) for r in range(2)]
    pool = WorkerPool(KvAwarePolicy(), 256, 4.0, KEYS)
    url = "http://127.0.0.1:9"
    spec = WorkerSpec(url, "worker", kv_events=f"tcp://127.0.0.1:{events}", kv_replay=f"tcp://127.0.0.1:{replay}")
    args = parser().parse_args(["--worker", url, "--kv-events-port", str(events), "--kv-replay-port", str(replay),
                                "--data-parallel-size", "2", "--data-parallel-routing", "engine"])  # fmt: skip
    both = {"kv_events": replica_endpoints(spec.kv_events, 2), "kv_replay": replica_endpoints(spec.kv_replay, 2)}
    assert static_workers(args) == [WorkerSpec(url, "worker", **both)]
    pool.set_workers(static_workers(args))
    pool.apply_metrics(url, WorkerMetrics(block_size=16, num_gpu_blocks=1000))
    hub = KvEventHub(pool, "kv-events", replay_timeout=0.5)
    job = asyncio.create_task(hub.run(interval=0.05))
    engines = [BlockPool(64, 16, ranks=1) for _ in range(2)]
    try:
        for rank, (engine, text) in enumerate(zip(engines, TEXTS, strict=True)):
            engine.events = []
            engine.insert(block_hashes_text(text, 16), token_ids(text))
            publishers[rank].publish(engine.take_events())
        await _until(lambda: all(pool.index.match(KEYS(t)).get(url) for t in TEXTS))
        assert set(hub.subs) == {f"{url}#dp0", f"{url}#dp1"} and list(pool.workers) == [url]
        assert [pool.index.match(KEYS(t))[url] for t in TEXTS] == [len(KEYS(t)) for t in TEXTS]
        engines[0].reset()  # rank 0 clears its cache: rank 1's blocks stay
        publishers[0].publish(engines[0].take_events())
        await _until(lambda: not pool.index.match(KEYS(TEXTS[0])).get(url))
        assert pool.index.match(KEYS(TEXTS[1]))[url] == len(KEYS(TEXTS[1]))
    finally:
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        for publisher in publishers:
            publisher.shutdown()
