"""Router replicas share their in-flight counts, so that each bounds a worker's load by what all sent.

A replica only knows the requests it sent itself; with N replicas its view of a worker's in-flight
prompt work is a 1/N sample, and the bounded-load policy then lets one worker's queue grow (the
simulator measures the SLO loss: bench/results/cache-replicas.md). Each replica serves its own
counts at `GET /internal/load` and polls its peers every `interval` seconds; their sums become the
workers' `peer_inflight` and `peer_blocks`. A peer that stops answering counts for nothing after
`stale_after` intervals. In a cluster the replicas find each other through the pod watch
(`set_peers`); with an API key the exchange needs it too (the same bearer the clients send), so
nobody without it can read the counts or feed a replica false ones.

The same poll carries the routes a replica chose since the peer's last poll (`?since=SEQ`): the
workers each prompt went to and its block keys. Each replica records them in its own index, the
guess it made for its own routes, which the engines' KV events then confirm or correct. Without
them a replica learns of a peer's route only once the engine has computed the prompt (seconds
under a queue), and requests sharing that prefix meanwhile look cold to it: simulated on the
Mooncake trace with 2 replicas, 29.4% prefix hit against one replica's 30.1%, and 30.1-30.2% at
2-8 replicas with the routes shared (bench/results/cache-replicas.md). While every peer passes on
its routes the replicas' indexes agree even without KV events, and the kv-aware policy lets
prefixes stick (`routes_shared`). Block keys are hashes of prompt text, so a
replica hands them only to a caller that holds the API key, or, without a key, to one of its
peers' addresses; a replica polls from the address it serves on, so that check holds where pods
share one machine (the local cluster). Behind a proxy that rewrites source addresses (a service mesh
sidecar) only the key makes the routes flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import aiohttp
import orjson

from xpyd_http.messages import Reply, Request
from xpyd_router.http.access import ApiKey
from xpyd_router.model import RouterContext
from xpyd_router.pool import WorkerPool

TEXT = "text/plain; charset=utf-8"
log = logging.getLogger("xpyd_router.loadshare")
PATH = "/internal/load"
LOG_BLOCKS = 1 << 18  # block keys the route log keeps for its peers (a few MB); older routes go first
REPLY_BLOCKS = 1 << 13  # block keys one reply carries at most (the newest routes; what is older is skipped)
MAX_ROUTE_BLOCKS = 1 << 16  # a peer's route with more block keys than this is ignored
MAX_ROUTE_WORKERS = 8  # or naming more workers than this (a route names its prefill and decode worker)
MAX_REPLY_BYTES = 4 << 20  # a peer's reply longer than this is dropped unread (this version's: < 300 KB)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def poll_source(host: str) -> str | None:
    """The address to poll peers from: the one the router listens on when that is one address (in a pod,
    `--host $(POD_IP)`), else None (a wildcard or a name: the system picks)."""
    address = _address(host)
    return None if address is None or address.is_unspecified else str(address)


def _loopback(host: str) -> bool:
    address = _address(host)
    return address.is_loopback if address is not None else host == "localhost"


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
        api_key: str | Sequence[str] | None = None,
        source: str | None = None,
        key_file: str | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.pool = pool
        # the address the polls leave from: the one this replica serves on, so that a peer that checks
        # the caller's address against its peers' finds it (pods on one host, as in the local cluster,
        # would otherwise all poll from its first address); None: the system picks
        self.source = source
        self.peers: list[str] = []
        self.access = ApiKey(api_key, key_file)  # follows --api-key-file: keys rotate under a running router
        self._key_at: dict[str, int] = {}  # peer -> which of the keys it last took (the next one after a 401)
        self.tls = tls  # the peers' client context (HTTPS), current after a certificate reload; None: HTTP
        self.interval = interval
        self.stale_s = stale_after * interval
        self.reports: dict[str, tuple[float, dict[str, list[int]]]] = {}  # peer -> (when, worker -> counts)
        self.routed: dict[str, float] = {}  # peer -> when its last reply carried its routes
        self.seq = 0  # routes this replica logged so far
        self.log: deque[tuple[int, list[str], Sequence[int]]] = deque()  # (seq, worker ids, block keys)
        self._logged = 0  # block keys in the log
        self.since: dict[str, int] = {}  # peer -> the last of its routes this replica has
        self.learnt = 0  # (route, worker) pairs of the peers' recorded in the index
        self.routes_flowing = False  # every peer's replies carried routes lately (the policy context's routes_shared)
        self._ids: dict[str, str] = {}  # worker name -> worker_id (hashed once)
        self._hosts: set[str] = set()  # the peers' hosts: who may read the routes when there is no key
        self._far: set[str] = set()  # peers polled from the system's address (see set_peers)
        self.set_peers(peers)

    def counts(self) -> dict[str, list[int]]:
        """This replica's own counts: worker id -> [in-flight requests, in-flight uncached prompt blocks]."""
        return {self._id(n): [w.inflight, w.inflight_blocks] for n, w in self.pool.workers.items()}

    def snapshot(self) -> bytes:
        return orjson.dumps(self.counts())

    def _id(self, name: str) -> str:
        wid = self._ids.get(name)
        if wid is None:
            if len(self._ids) > 2 * len(self.pool.workers) + 64:  # workers come and go: forget the gone
                self._ids = {n: i for n, i in self._ids.items() if n in self.pool.workers}
            wid = self._ids[name] = worker_id(name)
        return wid

    def note(self, workers: tuple[str, ...], blocks: Sequence[int]) -> None:
        """A route this replica chose (the pool's hook while it has peers): kept for the peers' polls."""
        self.seq += 1
        self.log.append((self.seq, [self._id(w) for w in workers], blocks))
        self._logged += len(blocks)
        while self._logged > LOG_BLOCKS and len(self.log) > 1:
            self._logged -= len(self.log.popleft()[2])

    def routes_since(self, since: int) -> list[list[object]]:
        """The logged routes after `since` (all of them when `since` is ahead: the asker's count is of an
        earlier run of this replica), newest first up to REPLY_BLOCKS block keys, in the order chosen."""
        if since > self.seq:
            since = 0
        out: list[list[object]] = []
        budget = REPLY_BLOCKS
        for seq, ids, blocks in reversed(self.log):
            if seq <= since:
                break
            if len(blocks) > budget:
                if len(blocks) > REPLY_BLOCKS:  # never fits a reply: the peers learn it from the events
                    continue
                break
            budget -= len(blocks)
            out.append([ids, blocks])
        out.reverse()
        return out

    def learn(self, routes: object) -> None:
        """Record a peer's routes in this replica's index, as it records its own (entries of source
        `peer`); malformed ones are skipped."""
        if not isinstance(routes, list):
            return
        names = {self._id(n): n for n in self.pool.workers}
        index = self.pool.index
        for route in routes:
            if not (isinstance(route, list) and len(route) == 2):
                continue
            ids, blocks = route
            if not (isinstance(ids, list) and len(ids) <= MAX_ROUTE_WORKERS and isinstance(blocks, list)):
                continue
            if not 0 < len(blocks) <= MAX_ROUTE_BLOCKS:
                continue
            if not all(type(b) is int for b in blocks):
                continue
            for wid in ids:
                name = names.get(wid) if isinstance(wid, str) else None
                if name is not None:
                    index.record_peer(name, blocks)
                    self.learnt += 1

    def set_peers(self, peers: list[str]) -> None:
        """The current peers (from discovery); reports of peers that left are dropped."""
        self.peers = [p.rstrip("/") for p in peers]
        if self.tls is not None:  # replicas serving HTTPS are polled over it (discovery names http:// URLs)
            self.peers = ["https://" + p.removeprefix("http://") if p.startswith("http://") else p for p in self.peers]
        self.reports = {p: r for p, r in self.reports.items() if p in self.peers}
        self.since = {p: s for p, s in self.since.items() if p in self.peers}
        self.routed = {p: t for p, t in self.routed.items() if p in self.peers}
        self._key_at = {p: i for p, i in self._key_at.items() if p in self.peers}
        self._hosts = {urlsplit(p).hostname or "" for p in self.peers}
        # polls leave from this replica's own address, except from a loopback one to a peer elsewhere
        # (a router listening on 127.0.0.1 could not reach it from there)
        near = not self.source or not _loopback(self.source)
        self._far = set() if near else {p for p in self.peers if not _loopback(urlsplit(p).hostname or "")}
        self.pool.on_route = self.note if self.peers else None  # a lone replica logs nothing
        if not self.peers:  # a lone replica: clear what the last peers reported, then the loop idles
            self.log.clear()
            self._logged = 0
            self.apply(time.monotonic())
        self._tell_policy()

    def _tell_policy(self) -> None:
        """The policy's context: how many replicas route to these workers, and whether every peer passes
        on its routes (the kv-aware policy lets prefixes stick only where the replicas' indexes agree)."""
        self.pool.policy.set_context(RouterContext(replicas=len(self.peers) + 1, routes_shared=self.routes_flowing))

    async def handle(self, request: Request) -> Reply:
        if not self.access.allows(request.header("Authorization")):
            return Reply(401, b"unauthorized", TEXT)
        raw = request.query.get("since")
        if raw is None:  # a replica of an earlier version: the counts alone
            return Reply(200, self.snapshot())
        try:
            since = int(raw)
        except ValueError:
            return Reply(400, f"since must be an integer, got {raw[:40]!r}".encode(), TEXT)
        reply: dict[str, object] = {"load": self.counts(), "seq": self.seq}
        if since >= 0 and (self.access.required or request.remote in self._hosts):
            reply["routes"] = self.routes_since(since)
        try:
            body = orjson.dumps(reply)
        except (TypeError, orjson.JSONEncodeError):  # a block key beyond 64 bits: the counts alone
            body = orjson.dumps({"load": reply["load"], "seq": self.seq})
        return Reply(200, body)

    def apply(self, now: float) -> None:
        """Sum the fresh peer reports into every worker's peer counts; tell the policy whether every
        peer is passing on its routes (then the replicas' indexes agree and prefixes may stick)."""
        self.routes_flowing = bool(self.peers) and all(
            now - self.routed.get(p, -1e18) <= self.stale_s for p in self.peers
        )
        self._tell_policy()
        fresh = [counts for when, counts in self.reports.values() if now - when <= self.stale_s]
        for name, worker in self.pool.workers.items():
            inflight = blocks = 0
            wid = self._id(name)
            for counts in fresh:
                mine = counts.get(wid)
                if mine is not None:
                    inflight += mine[0]
                    blocks += mine[1]
            worker.peer_inflight, worker.peer_blocks = inflight, blocks

    def _session(self, peer: str, bound: aiohttp.ClientSession, plain: aiohttp.ClientSession) -> aiohttp.ClientSession:
        """The session that polls the peer: from this replica's own address, or the system's (`_far`)."""
        return plain if peer in self._far else bound

    def _headers(self, peer: str) -> dict[str, str]:
        """The bearer for `peer`: one of this replica's keys, the one it last took (keys rotate one by one)."""
        keys = self.access.keys
        if not keys:
            return {}
        return {"Authorization": f"Bearer {keys[self._key_at.get(peer, 0) % len(keys)]}"}

    async def _poll(self, session: aiohttp.ClientSession, peer: str) -> None:
        url = f"{peer}{PATH}?since={self.since.get(peer, -1)}"  # -1: no routes yet, only where they stand
        trust: ssl.SSLContext | bool = self.tls() if self.tls is not None and peer.startswith("https:") else True
        try:
            async with session.get(url, headers=self._headers(peer), ssl=trust) as resp:
                if resp.status == 401:  # mid-rotation the peer holds another key: try the next one
                    self._key_at[peer] = self._key_at.get(peer, 0) + 1
                if resp.status != 200:
                    return
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_REPLY_BYTES:
                        return
                data = orjson.loads(body)
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            return
        if not isinstance(data, dict):
            return
        now = time.monotonic()
        counts = data.get("load")
        if isinstance(counts, dict):  # this version's reply: counts, then the routes since the last poll
            seq = data.get("seq")
            if type(seq) is int:
                self.since[peer] = seq
            routes = data.get("routes")
            if isinstance(routes, list):
                self.routed[peer] = now
                self.learn(routes)
        else:  # an earlier version's: the counts alone
            counts = data
        self.reports[peer] = (now, {str(k): v for k, v in counts.items() if isinstance(v, list)})

    async def run(self, _: WorkerPool | None = None) -> None:
        """Poll every peer each interval, forever (a background job of the router)."""
        timeout = aiohttp.ClientTimeout(total=max(self.interval, 0.05))
        connector = aiohttp.TCPConnector(local_addr=(self.source, 0)) if self.source else None
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as bound,
            aiohttp.ClientSession(timeout=timeout) as plain,
        ):
            while True:
                started = time.monotonic()
                if not self.peers:  # nobody to ask: no requests, no per-worker pass on the router's loop
                    await asyncio.sleep(self.interval)
                    continue
                with contextlib.suppress(Exception):  # one bad round must not end the exchange
                    await asyncio.gather(*(self._poll(self._session(p, bound, plain), p) for p in list(self.peers)))
                    self.apply(time.monotonic())
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
