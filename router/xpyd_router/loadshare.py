"""Router replicas share their in-flight counts, so that each bounds a worker's load by what all sent.

A replica only knows the requests it sent itself; with N replicas its view of a worker's in-flight
prompt work is a 1/N sample, and the bounded-load policy then lets one worker's queue grow (the
simulator measures the SLO loss: bench/results/cache-replicas.md). Each replica serves its own
counts at `GET /internal/load` and polls its peers every `interval` seconds; their sums become the
workers' `peer_inflight` and `peer_blocks`. A peer that stops answering counts for nothing after
`stale_after` intervals. In a cluster the replicas find each other through the pod watch
(`set_peers`); with an API key the exchange needs it too (the same bearer the clients send), so
nobody without it can read the counts or feed a replica false ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time

import aiohttp
import orjson
from aiohttp import web

from xpyd_router.access import ApiKey
from xpyd_router.pool import WorkerPool

log = logging.getLogger("xpyd_router.loadshare")
PATH = "/internal/load"


def worker_id(name: str) -> str:
    """The id replicas share a worker's counts under: its URL hashed, so the endpoint names no address."""
    return hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


class LoadShare:
    """This replica's side of the exchange: the endpoint it serves and the loop polling its peers."""

    def __init__(
        self,
        pool: WorkerPool,
        peers: list[str],
        interval: float = 0.1,
        stale_after: float = 5.0,
        api_key: str | None = None,
    ) -> None:
        self.pool = pool
        self.peers: list[str] = []
        self.access = ApiKey(api_key)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.interval = interval
        self.stale_s = stale_after * interval
        self.reports: dict[str, tuple[float, dict[str, list[int]]]] = {}  # peer -> (when, worker -> counts)
        self.set_peers(peers)

    def snapshot(self) -> bytes:
        """This replica's own counts: worker id -> [in-flight requests, in-flight uncached prompt blocks]."""
        return orjson.dumps({worker_id(n): [w.inflight, w.inflight_blocks] for n, w in self.pool.workers.items()})

    def set_peers(self, peers: list[str]) -> None:
        """The current peers (from discovery); reports of peers that left are dropped."""
        self.peers = [p.rstrip("/") for p in peers]
        self.reports = {p: r for p, r in self.reports.items() if p in self.peers}
        if not self.peers:  # a lone replica: clear what the last peers reported, then the loop idles
            self.apply(time.monotonic())
        if hasattr(self.pool.policy, "replicas"):  # the kv-aware policy sticks prefixes only with a shared index
            self.pool.policy.replicas = len(self.peers) + 1

    async def handle(self, request: web.Request) -> web.Response:
        if not self.access.allows(request.headers.get("Authorization")):
            return web.Response(status=401, text="unauthorized")
        return web.Response(body=self.snapshot(), content_type="application/json")

    def apply(self, now: float) -> None:
        """Sum the fresh peer reports into every worker's peer counts."""
        fresh = [counts for when, counts in self.reports.values() if now - when <= self.stale_s]
        for name, worker in self.pool.workers.items():
            inflight = blocks = 0
            wid = worker_id(name)
            for counts in fresh:
                mine = counts.get(wid)
                if mine is not None:
                    inflight += mine[0]
                    blocks += mine[1]
            worker.peer_inflight, worker.peer_blocks = inflight, blocks

    async def _poll(self, session: aiohttp.ClientSession, peer: str) -> None:
        try:
            async with session.get(peer + PATH, headers=self._headers) as resp:
                data = orjson.loads(await resp.read()) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return
        if isinstance(data, dict):
            self.reports[peer] = (time.monotonic(), {str(k): v for k, v in data.items() if isinstance(v, list)})

    async def run(self, _: WorkerPool | None = None) -> None:
        """Poll every peer each interval, forever (a background job of the router)."""
        timeout = aiohttp.ClientTimeout(total=max(self.interval, 0.05))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.monotonic()
                if not self.peers:  # nobody to ask: no requests, no per-worker pass on the router's loop
                    await asyncio.sleep(self.interval)
                    continue
                with contextlib.suppress(Exception):  # one bad round must not end the exchange
                    await asyncio.gather(*(self._poll(session, p) for p in list(self.peers)))
                    self.apply(time.monotonic())
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
