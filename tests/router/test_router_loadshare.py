"""Router replicas sharing in-flight counts and routes: the endpoint, the sums, stale peers, who may read
the routes, and two live replicas."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpyd_http.server import Server
from xpyd_router import loadshare
from xpyd_router.loadshare import PATH, LoadShare, worker_id
from xpyd_router.model import RouteRequest
from xpyd_router.policy.registry import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"
IA, IB = worker_id(A), worker_id(B)  # the ids replicas exchange: hashed, no address leaves the router


def pool() -> WorkerPool:
    p = WorkerPool(KvAwarePolicy(), block_chars=256)
    p.set_workers([WorkerSpec(A, "worker"), WorkerSpec(B, "worker")])
    return p


@contextlib.asynccontextmanager
async def serving(share: LoadShare, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """The replica's endpoint on a loopback port: its base URL."""
    server = Server({("GET", PATH): share.handle})
    await server.listen(host, 0)
    try:
        yield f"http://{host}:{server.port}"
    finally:
        await server.close(1.0)


@contextlib.asynccontextmanager
async def exchanging(
    pools: list[WorkerPool], hosts: tuple[str, str] = ("127.0.0.1", "127.0.0.1"), bind: bool = False
) -> AsyncIterator[list[LoadShare]]:
    """Two live replicas, each serving its endpoint on its host and polling the other's every 50 ms
    (from its own host when `bind`)."""
    shares = [LoadShare(p, [], interval=0.05, source=h if bind else None) for p, h in zip(pools, hosts, strict=True)]
    async with serving(shares[0], hosts[0]) as first, serving(shares[1], hosts[1]) as second:
        shares[0].set_peers([second])
        shares[1].set_peers([first])
        tasks = [asyncio.create_task(s.run()) for s in shares]
        try:
            yield shares
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def until(done: Callable[[], bool]) -> None:
    """Wait up to 2 s for a condition the exchange brings about."""
    for _ in range(100):
        if done():
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("reports", "now", "want"),
    [
        ({}, 10.0, {A: (0, 0), B: (0, 0)}),
        ({"p1": (10.0, {IA: [2, 30]})}, 10.0, {A: (2, 30), B: (0, 0)}),
        ({"p1": (10.0, {IA: [2, 30]}), "p2": (9.9, {IA: [1, 5], IB: [4, 0]})}, 10.0, {A: (3, 35), B: (4, 0)}),
        ({"p1": (9.0, {IA: [2, 30]}), "p2": (9.9, {IB: [4, 0]})}, 10.0, {A: (0, 0), B: (4, 0)}),  # p1 went quiet
        ({"p1": (10.0, {worker_id("http://gone:1"): [7, 7]})}, 10.0, {A: (0, 0), B: (0, 0)}),  # not ours
    ],
)
def test_fresh_peer_reports_are_summed_per_worker(
    reports: dict[str, tuple[float, dict[str, list[int]]]], now: float, want: dict[str, tuple[int, int]]
) -> None:
    p = pool()
    share = LoadShare(p, ["http://peer"], interval=0.1, stale_after=5)
    share.reports = reports
    share.apply(now)
    assert {n: (w.peer_inflight, w.peer_blocks) for n, w in p.workers.items()} == want


def test_the_snapshot_holds_only_this_replicas_own_counts() -> None:
    p = pool()
    p.begin(A, 12)
    p.workers[A].peer_inflight, p.workers[A].peer_blocks = 5, 50  # learnt from others: never passed on
    body = LoadShare(p, []).snapshot()
    assert orjson.loads(body) == {IA: [1, 12], IB: [0, 0]}
    assert b"127.0.0.1" not in body


async def test_two_replicas_learn_each_others_counts() -> None:
    pools = [pool(), pool()]
    pools[0].begin(A, 40)
    pools[1].begin(B, 7)
    async with exchanging(pools):
        await until(lambda: pools[0].workers[B].peer_blocks == 7 and pools[1].workers[A].peer_blocks == 40)
        assert (pools[0].workers[B].peer_inflight, pools[0].workers[B].peer_blocks) == (1, 7)
        assert (pools[1].workers[A].peer_inflight, pools[1].workers[A].peer_blocks) == (1, 40)
        assert pools[0].workers[A].work == 40 and pools[1].workers[A].work == 40


@pytest.mark.parametrize(
    ("key", "sent", "status"),
    [
        (None, None, 200),  # no API key: open, like the API itself
        ("s3cret", None, 401),
        ("s3cret", "Bearer wrong", 401),
        ("s3cret", "Bearer s3cret", 200),
    ],
)
async def test_the_exchange_needs_the_api_key_when_there_is_one(key: str | None, sent: str | None, status: int) -> None:
    share = LoadShare(pool(), [], api_key=key)
    async with serving(share) as server, aiohttp.ClientSession() as session:
        headers = {"Authorization": sent} if sent else {}
        async with session.get(server + PATH, headers=headers) as resp:
            assert resp.status == status


def test_set_peers_forgets_the_reports_of_peers_that_left() -> None:
    share = LoadShare(pool(), ["http://r1:8000", "http://r2:8000"])
    share.reports = {"http://r1:8000": (1.0, {IA: [1, 1]}), "http://r2:8000": (1.0, {IB: [2, 2]})}
    share.set_peers(["http://r2:8000/", "http://r3:8000"])
    assert share.peers == ["http://r2:8000", "http://r3:8000"]
    assert list(share.reports) == ["http://r2:8000"]


def test_peers_tell_the_kv_aware_policy_how_many_replicas_route() -> None:
    p = pool()
    share = LoadShare(p, ["http://r1:8000"])
    assert isinstance(p.policy, KvAwarePolicy)
    assert p.policy.context.replicas == 2
    share.set_peers([])
    assert p.policy.context.replicas == 1


# --- routes: each replica passes on where it sent which prompt, the others record the same guess ---


def _logged(share: LoadShare, *routes: tuple[tuple[str, ...], list[int]]) -> None:
    for workers, blocks in routes:
        share.note(workers, blocks)


@pytest.mark.parametrize(
    ("since", "want"),
    [
        (0, [[[IA], [1, 2]], [[IA, IB], [3]], [[IB], [4, 5, 6]]]),  # all, oldest first
        (1, [[[IA, IB], [3]], [[IB], [4, 5, 6]]]),
        (3, []),  # the asker is up to date
        (9, [[[IA], [1, 2]], [[IA, IB], [3]], [[IB], [4, 5, 6]]]),  # ahead: this replica restarted, all again
    ],
)
def test_routes_since_a_peers_last_poll(since: int, want: list[list[object]]) -> None:
    share = LoadShare(pool(), ["http://127.0.0.1:7001"])
    _logged(share, ((A,), [1, 2]), ((A, B), [3]), ((B,), [4, 5, 6]))
    assert share.seq == 3
    assert share.routes_since(since) == want


def test_a_reply_carries_the_newest_routes_up_to_its_block_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadshare, "REPLY_BLOCKS", 5)
    share = LoadShare(pool(), ["http://127.0.0.1:7001"])
    _logged(share, ((A,), [1, 2]), ((A,), [3, 4, 5]), ((B,), list(range(10, 19))), ((B,), [6, 7]))
    # the 9-block route never fits a reply and is skipped; the budget then stops at the 3-block one
    assert share.routes_since(0) == [[[IA], [3, 4, 5]], [[IB], [6, 7]]]


def test_the_route_log_is_bounded_and_a_lone_replica_keeps_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadshare, "LOG_BLOCKS", 6)
    p = pool()
    share = LoadShare(p, ["http://127.0.0.1:7001"])
    assert p.on_route == share.note
    for i in range(5):
        share.note((A,), [i, i + 1, i + 2])
    assert [seq for seq, _, _ in share.log] == [4, 5]
    share.set_peers([])
    assert share.pool.on_route is None and not share.log  # (share.pool is p)


def test_the_pool_tells_the_hook_which_workers_got_the_prompt() -> None:
    p = WorkerPool(KvAwarePolicy(), block_chars=256)
    p.set_workers([WorkerSpec(A, "prefill"), WorkerSpec(B, "decode")])
    seen: list[tuple[tuple[str, ...], list[int]]] = []
    p.on_route = lambda workers, blocks: seen.append((workers, list(blocks)))
    p.route(RouteRequest([11, 12, 13] * 10, 1, 7680))
    p.route(RouteRequest([], 2, 10))  # no blocks: nothing to pass on
    assert seen == [((A, B), [11, 12, 13] * 10)]


@pytest.mark.parametrize(
    ("routes", "want"),
    [
        ([[[IA], [1, 2, 3]]], {A: 3, B: 0}),
        ([[[IA, IB], [4, 5]]], {A: 2, B: 2}),
        ([[[worker_id("http://gone:1")], [1]], [[IB], [9]]], {A: 0, B: 1}),  # not a worker of ours
        # malformed: skipped one by one, never an exception
        (
            [None, [IA, [1]], [[IA], "1,2"], [[IA], [1, "2"]], [[IA], [1.5]], [[IA], []], [[7], [1]], [[IA]]],
            {A: 0, B: 0},
        ),
        ("routes", {A: 0, B: 0}),
        ([[[IA], [True]]], {A: 0, B: 0}),  # bool is not a block key
        ([[[IA] * 9, [1]]], {}),  # a route names its prefill and decode worker, not nine
    ],
)
def test_learnt_routes_enter_the_index_as_guesses(routes: object, want: dict[str, int]) -> None:
    p = pool()
    share = LoadShare(p, ["http://127.0.0.1:7001"])
    share.learn(routes)
    assert {n: p.index.blocks_of(n) for n in (A, B)} == {A: 0, B: 0} | want


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4), lambda c: st.lists(c, max_size=4)))
@settings(max_examples=300, deadline=None)
def test_learning_arbitrary_json_never_raises(routes: object) -> None:
    share = LoadShare(pool(), ["http://127.0.0.1:7001"])
    share.learn(routes)
    share.learn([[[IA], routes]])


@pytest.mark.parametrize(
    ("key", "sent", "query", "peer", "status", "fields"),
    [
        (None, None, "", "127.0.0.1", 200, None),  # an earlier version's poll: the counts alone
        (None, None, "?since=0", "127.0.0.1", 200, {"load", "seq", "routes"}),  # a peer's address
        (None, None, "?since=0", "10.0.0.9", 200, {"load", "seq"}),  # not a peer, no key: no prompt hashes
        (None, None, "?since=-1", "127.0.0.1", 200, {"load", "seq"}),  # a first poll: where the log stands
        ("k", "Bearer k", "?since=0", "10.0.0.9", 200, {"load", "seq", "routes"}),  # the key is enough
        (None, None, "?since=x", "127.0.0.1", 400, None),
    ],
)
async def test_who_reads_the_routes(
    key: str | None, sent: str | None, query: str, peer: str, status: int, fields: set[str] | None
) -> None:
    share = LoadShare(pool(), [f"http://{peer}:7001"], api_key=key)
    share.note((A,), [1, 2])
    async with serving(share) as server, aiohttp.ClientSession() as session:
        headers = {"Authorization": sent} if sent else {}
        async with session.get(server + PATH + query, headers=headers) as resp:
            assert resp.status == status
            body = await resp.read()
    if status == 200:
        data = orjson.loads(body)
        if fields is None:
            assert data == {IA: [0, 0], IB: [0, 0]}
        else:
            assert set(data) == fields
            assert data.get("routes", [[[IA], [1, 2]]]) == [[[IA], [1, 2]]]


@pytest.mark.parametrize(
    ("peers", "routed", "want"),
    [
        ([], {}, False),  # a lone replica: nobody to share with (its policy counts one replica anyway)
        (["http://r1:1", "http://r2:1"], {"http://r1:1": 10.0, "http://r2:1": 9.9}, True),
        (["http://r1:1", "http://r2:1"], {"http://r1:1": 10.0}, False),  # r2 sends none (not ours to read?)
        (["http://r1:1"], {"http://r1:1": 9.0}, False),  # r1's last routes are stale
    ],
)
def test_prefixes_may_stick_only_while_every_peer_passes_on_its_routes(
    peers: list[str], routed: dict[str, float], want: bool
) -> None:
    p = pool()
    share = LoadShare(p, peers, interval=0.1, stale_after=5)
    share.routed = routed
    share.apply(10.0)
    assert isinstance(p.policy, KvAwarePolicy)
    assert p.policy.context.routes_shared is want


async def test_two_replicas_learn_each_others_routes() -> None:
    pools = [pool(), pool()]
    async with exchanging(pools) as shares:
        await until(lambda: all(s.since for s in shares))  # each has polled once: its cursor stands at the log's end
        prompt = RouteRequest(list(range(100, 140)), 5, 40 * 256)
        chosen = pools[0].route(prompt).decode.worker  # replica 0 routes a prompt...
        await until(lambda: shares[1].learnt > 0)
        # ...and replica 1 now sees the same 40 blocks on that worker, before any engine event
        assert pools[1].index.match(prompt.blocks) == {chosen: 40}
        assert shares[1].learnt == 1 and shares[0].learnt == 0
        assert all(isinstance(p.policy, KvAwarePolicy) and p.policy.context.routes_shared for p in pools)


async def test_a_reply_over_the_size_limit_is_dropped_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadshare, "MAX_REPLY_BYTES", 200)  # a first reply (counts, no routes) fits
    pools = [pool(), pool()]
    async with exchanging(pools) as shares:
        await until(lambda: all(s.since for s in shares))
        pools[0].route(RouteRequest(list(range(10**12, 10**12 + 40)), 5, 40 * 256))  # ~600 bytes of keys
        await asyncio.sleep(0.3)  # six polls
        assert shares[1].learnt == 0 and shares[1].since[next(iter(shares[1].since))] == 0
        assert shares[1].pool.index.blocks_of(A) + shares[1].pool.index.blocks_of(B) == 0


@pytest.mark.parametrize(
    ("host", "want"),
    [("10.1.2.3", "10.1.2.3"), ("fd00::5", "fd00::5"), ("0.0.0.0", None), ("::", None), ("router-0", None)],
)
def test_polls_leave_from_the_address_the_router_serves_on(host: str, want: str | None) -> None:
    assert loadshare.poll_source(host) == want


@pytest.mark.parametrize("bind", [True, False])
async def test_replicas_sharing_one_host_pass_routes_when_polling_from_their_own_address(bind: bool) -> None:
    """Pods on one machine (the local cluster: every pod IP a loopback address) poll from its first
    address unless the poll leaves from the replica's own: then the peer, which hands routes without a
    key only to its peers' addresses, does not know the caller and sends counts alone."""
    pools = [pool(), pool()]
    async with exchanging(pools, hosts=("127.0.0.2", "127.0.0.3"), bind=bind) as shares:
        await until(lambda: all(s.since for s in shares))
        pools[0].route(RouteRequest(list(range(100, 140)), 5, 40 * 256))
        await until(lambda: shares[1].learnt > 0)
        if not bind:
            await asyncio.sleep(0.2)  # four more polls: still nothing
        assert (shares[1].learnt > 0) is bind
        assert all(s.reports for s in shares)  # the counts flow either way


async def test_the_exchange_shows_in_the_routers_metrics() -> None:
    """An operator sees whether replicas share routes: peers, whether every one passes them on, how
    many were recorded (0 sharing with peers means their polls do not reach, or do not know, this one)."""
    from prometheus_client import generate_latest

    from xpyd_router.metrics import RouterMetrics

    pools = [pool(), pool()]
    async with exchanging(pools) as shares:
        metrics = RouterMetrics("dd")
        metrics.peers(shares[1])
        before = generate_latest(metrics.registry).decode()
        await until(lambda: all(s.since for s in shares) and shares[1].routes_flowing)
        pools[0].route(RouteRequest(list(range(100, 140)), 5, 40 * 256))
        await until(lambda: shares[1].learnt > 0)
        text = generate_latest(metrics.registry).decode()
    assert 'xpyd_router_peers{deployment="dd"} 1.0' in before
    assert 'xpyd_router_peer_routes_total{deployment="dd"} 0.0' in before
    assert 'xpyd_router_peers_sharing_routes{deployment="dd"} 1.0' in text
    assert 'xpyd_router_peer_routes_total{deployment="dd"} 1.0' in text


@pytest.mark.parametrize(
    ("source", "peer", "want"),
    [
        ("127.0.0.2", "http://127.0.0.3:8000", "bound"),  # the local cluster: from the pod's own address
        ("127.0.0.1", "http://10.0.0.5:8000", "plain"),  # a loopback listener cannot reach a peer elsewhere from there
        ("10.0.0.4", "http://10.0.0.5:8000", "bound"),  # a pod IP: from it
        (None, "http://10.0.0.5:8000", "bound"),  # no source: the bound session is the system's choice too
    ],
)
def test_which_address_a_poll_leaves_from(source: str | None, peer: str, want: str) -> None:
    share = LoadShare(pool(), [peer], source=source)
    sessions: dict[str, Any] = {"bound": object(), "plain": object()}
    assert share._session(peer, sessions["bound"], sessions["plain"]) is sessions[want]
