"""A lean HTTP/1.1 keep-alive client for the worker hops (httptools parser, asyncio protocols).

Measured against aiohttp's client on the same hops (bench/router/stacks.py): it spends about half the
CPU per request, which is most of the router's per-request cost.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

import httptools


class UpstreamError(Exception):
    """The worker connection failed or broke off; `sent` tells whether any response byte had arrived."""

    def __init__(self, message: str, started: bool = False) -> None:
        super().__init__(message)
        self.started = started


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
            try:
                await asyncio.wait_for(self._waiter, self._conn.pool.read_timeout)
            except TimeoutError:
                raise UpstreamError(f"no data from the worker for {self._conn.pool.read_timeout:g}s", True) from None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:
            return
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.response
        if resp is not None and not resp.complete:
            started = resp.headers_done.done()
            resp._fail(UpstreamError(f"connection to {self.key[0]}:{self.key[1]} lost: {exc or 'closed'}", started))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.response is not None:
                self.response._fail(UpstreamError(f"bad HTTP from {self.key[0]}:{self.key[1]}: {exc}", True))
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
            resp._chunks.append(body)
            resp._wake()

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.complete = True
            if not self.parser.should_keep_alive():
                self.closed = True
            resp._wake()

    def send(self, head: bytes, body: bytes) -> UpstreamResponse:
        assert self.transport is not None
        self.response = UpstreamResponse(self)
        self.parser = httptools.HttpResponseParser(self)
        self.transport.writelines((head, body))
        return self.response

    def finish(self, resp: UpstreamResponse) -> None:
        if resp is not self.response:
            return
        self.response = None
        if resp.complete and not self.closed:
            self.used = True
            self.pool.idle.setdefault(self.key, []).append(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Upstream:
    """Keep-alive connections per worker address; one request at a time per connection."""

    def __init__(self, connect_timeout: float = 5.0, read_timeout: float | None = 600.0) -> None:
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout  # longest silence from a worker (headers or between chunks)
        self._keys: dict[str, tuple[str, int]] = {}

    def _key(self, base: str) -> tuple[str, int]:
        key = self._keys.get(base)
        if key is None:
            hostport = base.split("://", 1)[-1]
            host, _, port = hostport.rpartition(":")
            key = self._keys[base] = (host.strip("[]"), int(port))
        return key

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

    async def post(self, base: str, path: str, body: bytes) -> UpstreamResponse:
        """Sends the request and waits for the status line and headers."""
        key = self._key(base)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {key[0]}:{key[1]}\r\nContent-Type: application/json\r\n"
            f"Accept: */*\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            resp = conn.send(head, body)
            try:
                await self._headers(resp, key)
                return resp
            except UpstreamError as exc:
                if exc.started:
                    raise
                resp.close()  # a kept-alive connection the worker had closed: try a fresh one
            except BaseException:
                resp.close()
                raise
        conn = await self._connect(key)
        resp = conn.send(head, body)
        try:
            await self._headers(resp, key)
        except BaseException:
            resp.close()
            raise
        return resp

    async def _headers(self, resp: UpstreamResponse, key: tuple[str, int]) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(resp.headers_done), self.read_timeout)
        except TimeoutError:
            resp.close()  # unfinished: closes the connection, which cancels the request on the worker
            raise UpstreamError(f"no answer from {key[0]}:{key[1]} within {self.read_timeout:g}s", True) from None

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.abort()
        self.idle.clear()
