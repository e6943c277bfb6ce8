"""Router replicas sharing in-flight counts: the endpoint, the sums, stale peers, and two live replicas."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from xpyd_router.loadshare import PATH, LoadShare, worker_id
from xpyd_router.policies import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"
IA, IB = worker_id(A), worker_id(B)  # the ids replicas exchange: hashed, no address leaves the router


def pool() -> WorkerPool:
    p = WorkerPool(KvAwarePolicy(), block_chars=256)
    p.set_workers([WorkerSpec(A, "worker"), WorkerSpec(B, "worker")])
    return p


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
    servers, shares = [], []
    for p in pools:
        share = LoadShare(p, [], interval=0.05)
        app = web.Application()
        app.router.add_get(PATH, share.handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        shares.append(share)
    shares[0].peers = [str(servers[1].make_url("")).rstrip("/")]
    shares[1].peers = [str(servers[0].make_url("")).rstrip("/")]
    tasks = [asyncio.create_task(s.run()) for s in shares]
    try:
        for _ in range(100):
            await asyncio.sleep(0.02)
            if pools[0].workers[B].peer_blocks == 7 and pools[1].workers[A].peer_blocks == 40:
                break
        assert (pools[0].workers[B].peer_inflight, pools[0].workers[B].peer_blocks) == (1, 7)
        assert (pools[1].workers[A].peer_inflight, pools[1].workers[A].peer_blocks) == (1, 40)
        assert pools[0].workers[A].work == 40 and pools[1].workers[A].work == 40
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in servers:
            await s.close()


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
    app = web.Application()
    app.router.add_get(PATH, share.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": sent} if sent else {}
            async with session.get(server.make_url(PATH), headers=headers) as resp:
                assert resp.status == status
    finally:
        await server.close()


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
    assert p.policy.replicas == 2
    share.set_peers([])
    assert p.policy.replicas == 1
