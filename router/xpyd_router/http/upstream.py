"""A lean HTTP/1.1 keep-alive client for the worker hops (httptools parser, asyncio protocols).

Measured against aiohttp's client on the same hops (bench/router/stacks.py): it spends about half the
CPU per request, which is most of the router's per-request cost. Each connection has one watchdog
timer: until the first body byte it allows `first_byte` seconds, then `idle` seconds between reads;
data only moves a deadline, the timer re-arms itself when it fires early (no per-chunk timers).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

import httptools

from xpyd_router.targets import RANK_HEADER, split_target

MAX_REPLY_BYTES = 64 << 20  # a non-streamed reply larger than this is garbage


class UpstreamError(Exception):
    """The worker connection failed, broke off or stayed silent.

    `started`: some of the response had arrived. `worker_down`: a worker-level signal (refused, reset,
    timed out) rather than a bad answer to this one request.
    """

    def __init__(self, message: str, started: bool = False, worker_down: bool = True) -> None:
        super().__init__(message)
        self.started = started
        self.worker_down = worker_down


class UpstreamResponse:
    """Status and headers at once; body chunks as they arrive (one per network read)."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.content_type = "application/json"
        self.headers_done: asyncio.Future[None] = conn.loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self._error: UpstreamError | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        self._error = error
        if not self.headers_done.done():
            self.headers_done.set_exception(error)
        self._wake()

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            while self._chunks:
                yield self._chunks.popleft()
            if self._error is not None:
                raise self._error
            if self.complete:
                return
            self._waiter = self._conn.loop.create_future()
            await self._waiter  # woken by data, the end, a broken connection or the watchdog

    async def read(self, limit: int = MAX_REPLY_BYTES) -> bytes:
        if self.complete and self._error is None and sum(map(len, self._chunks)) <= limit:  # came whole, at once
            data, self._chunks = b"".join(self._chunks), deque()
            return data
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                raise UpstreamError(f"reply larger than {limit} bytes", True, worker_down=False)
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Ends the exchange: a finished response's connection goes back to the pool, else it is closed."""
        self._conn.finish(self)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Upstream, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.used = False
        self.timer: asyncio.TimerHandle | None = None
        self.expires = 0.0  # loop time the current response must show progress by (0: no limit)
        self.waiting_first = True  # no body byte yet: the first-byte budget applies
        self.idle = 0.0
        self.first_byte = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:
            return
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        resp = self.response
        if resp is not None and not resp.complete:
            started = resp.headers_done.done()
            resp._fail(UpstreamError(f"connection to {self.key[0]}:{self.key[1]} lost: {exc or 'closed'}", started))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.response is not None:
                msg = f"bad HTTP from {self.key[0]}:{self.key[1]}: {exc}"
                self.response._fail(UpstreamError(msg, True, worker_down=False))
            self.abort()

    # the watchdog
    def _arm(self, first_byte: float | None, idle: float | None) -> None:
        self.idle = idle or 0.0
        self.first_byte = first_byte or 0.0
        self.waiting_first = True
        self.expires = 0.0
        if first_byte:
            self.expires = self.loop.time() + first_byte
            self.timer = self.loop.call_at(self.expires, self._watch)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _progress(self) -> None:
        """Body bytes arrived: the idle budget starts again."""
        if not self.idle:
            if self.waiting_first:
                self.waiting_first = False
                self._disarm()
            return
        self.expires = self.loop.time() + self.idle
        if self.waiting_first:  # the first-byte timer may be far away: bring it in once
            self.waiting_first = False
            self._disarm()
            self.timer = self.loop.call_at(self.expires, self._watch)

    def _watch(self) -> None:
        self.timer = None
        resp = self.response
        if resp is None or resp.complete:
            return
        if self.loop.time() < self.expires:
            self.timer = self.loop.call_at(self.expires, self._watch)
            return
        what, budget = ("no first byte", self.first_byte) if self.waiting_first else ("no data", self.idle)
        resp._fail(UpstreamError(f"{what} from {self.key[0]}:{self.key[1]} within {budget:g}s", True))
        self.abort()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None and name.lower() == b"content-type":
            self.response.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.status = self.parser.get_status_code()
            if not resp.headers_done.done():
                resp.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        resp = self.response
        if resp is not None:
            self._progress()
            resp._chunks.append(body)
            resp._wake()

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.complete = True
            self._disarm()
            if not self.parser.should_keep_alive():
                self.closed = True
            resp._wake()

    def send(self, head: bytes, body: bytes, first_byte: float | None, idle: float | None) -> UpstreamResponse:
        assert self.transport is not None
        self.response = UpstreamResponse(self)
        self.parser = httptools.HttpResponseParser(self)
        self._arm(first_byte, idle)
        self.transport.writelines((head, body))
        return self.response

    def finish(self, resp: UpstreamResponse) -> None:
        if resp is not self.response:
            return
        self.response = None
        self._disarm()
        if resp.complete and not self.closed:
            self.used = True
            self.pool.idle.setdefault(self.key, []).append(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()


class Upstream:
    """Keep-alive connections per worker address; one request at a time per connection."""

    def __init__(
        self, connect_timeout: float = 5.0, first_byte_timeout: float | None = 120.0, idle_timeout: float | None = 30.0
    ) -> None:
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout  # send to first body byte
        self.idle_timeout = idle_timeout  # longest silence between body reads
        self._keys: dict[str, tuple[tuple[str, int], str]] = {}

    def _key(self, target: str) -> tuple[tuple[str, int], str]:
        """(host, port) of a target name (a base URL, or a data-parallel rank of one) and the extra
        header line it needs (the rank's `X-data-parallel-rank`)."""
        found = self._keys.get(target)
        if found is None:
            base, rank = split_target(target)
            host, _, port = base.split("://", 1)[-1].rpartition(":")
            extra = "" if rank is None else f"{RANK_HEADER}: {rank}\r\n"
            found = self._keys[target] = ((host.strip("[]"), int(port)), extra)
        return found

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn = await loop.create_connection(lambda: _Connection(self, key), key[0], key[1])
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {exc or type(exc).__name__}") from exc
        if conn.transport is None:  # uvloop may report connection_made after returning
            conn.connection_made(transport)
        return conn

    async def post(self, target: str, path: str, body: bytes, first_byte: bool = True) -> UpstreamResponse:
        """Sends the request to a target (xpyd_router.targets) and waits for the status line and headers.

        `first_byte=False` lifts the first-byte budget (a non-streamed decode is silent until it is done;
        the caller's request deadline bounds it); the idle budget between reads always applies.
        """
        key, extra = self._key(target)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {key[0]}:{key[1]}\r\nContent-Type: application/json\r\n"
            f"Accept: */*\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        budget = self.first_byte_timeout if first_byte else None
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            resp = conn.send(head, body, budget, self.idle_timeout)
            try:
                await self._headers(resp)
                return resp
            except UpstreamError as exc:
                resp.close()
                if exc.started:
                    raise
                # a kept-alive connection the worker had closed: try a fresh one
            except BaseException:
                resp.close()
                raise
        conn = await self._connect(key)
        resp = conn.send(head, body, budget, self.idle_timeout)
        try:
            await self._headers(resp)
        except BaseException:
            resp.close()
            raise
        return resp

    @staticmethod
    async def _headers(resp: UpstreamResponse) -> None:
        await resp.headers_done  # set by the parser, a lost connection or the watchdog

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.abort()
        self.idle.clear()
