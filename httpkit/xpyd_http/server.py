"""The listener the router and the engine emulator serve on: HTTP/1.1 parsed by httptools on the event loop.

Why not aiohttp's server: every request of the router's proxy path pays for it, and on loopback
aiohttp.web costs 48 CPU-us per request where this costs 24 (bench/results/router.md, HTTP stack,
one run); the router's upstream client (xpyd_router.http.upstream) is built the same way. The
emulator serves on it too, so the limits below are written (and fuzzed) once. What it does, and no more:
- keep-alive and pipelining (one request at a time per connection, in order; reading pauses while
  requests wait), Content-Length and chunked bodies, `Expect: 100-continue`;
- a cap on connections (past it: 503 and close, without reading), a header deadline (the slowloris
  bound, and by default how long an idle keep-alive connection stays), a cap on the request head
  (431) and body (413, checked as the bytes arrive), one log line per malformed request (400);
- streamed answers with write backpressure; a handler whose client left is cancelled;
- a graceful stop: no new connections, in-flight requests get `shutdown_timeout` to finish.
The errors it writes itself are OpenAI's shape unless the server is given its own `errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools

from xpyd_http.messages import Answer, Handler, Reply, Request, Routes, Stream, error_reply

MAX_HEAD_BYTES = 64 << 10  # request line and headers together
LINGER = 1.0  # after an early answer (408, 413), the unread rest of the body is read and dropped this long
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

ErrorReply = Callable[[int, str, str], Reply]  # (status, message, OpenAI error type) -> the answer


def busy_answer(errors: ErrorReply, name: str) -> bytes:
    """The bytes a connection past the cap gets: a 503 with Retry-After, then the connection's end."""
    reply = errors(503, f"too many connections to the {name}; retry shortly", "service_unavailable")
    reply.headers = (*reply.headers, ("Retry-After", "1"))
    return reply.encode(keep_alive=False)


class _HeadTooLarge(Exception):
    pass


class _Busy(asyncio.Protocol):
    """Past the connection cap: a 503 and goodbye, without reading the request."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.answer)  # type: ignore[attr-defined]
        transport.close()


class Connection(asyncio.Protocol):
    """One client connection: parses requests, serves them in order, writes their answers."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.max_body = server.max_body
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.parsing: Request | None = None  # the request whose bytes are arriving
        self.current: Request | None = None  # the request being served
        self.task: asyncio.Task[None] | None = None
        self.pending: deque[Request] = deque()  # pipelined requests waiting their turn
        self.timer: asyncio.TimerHandle | None = None  # the header deadline (or the keep-alive timeout)
        self.idle = False  # waiting for a next request under a keep-alive timeout of its own
        self.dropping = False  # reading and dropping what is left (lingering, or past a parse error)
        self.url = b""
        self.head_bytes = 0
        self.headers: dict[str, str] = {}
        self.writable: asyncio.Future[None] | None = None  # set while the transport's buffer is full

    # the transport's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else ""
        self.server.connections.add(self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._disarm()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its handler stops (and closes its upstream request)
        for req in (self.parsing, self.current, *self.pending):
            if req is not None:
                req.wake()
        writable = self.writable
        if writable is not None and not writable.done():
            writable.set_exception(ConnectionResetError("the client closed the connection"))
            writable.exception()  # retrieved: nobody may be waiting on it

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.dropping:
            return
        if self.idle:  # the next request's first bytes: its head must now arrive within the header deadline
            self.idle = False
            self._arm()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # not ours to speak: serve what was asked, then close
            self.dropping = True
            for req in (self.current, *self.pending):
                if req is not None:
                    req.keep_alive = False
        except httptools.HttpParserError as exc:
            self._malformed(exc)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.head_bytes = 0
        self.headers = {}

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        self._disarm()
        parser = self.parser
        method = parser.get_method().decode("latin-1")
        req = Request(self, method, self.url.decode("latin-1"), self.headers, parser.get_http_version())
        req.keep_alive = parser.should_keep_alive() and not self.server.stopping
        length = self.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            req.too_large = True
        self.parsing = req
        if self.current is None:
            self._start(req)
        else:
            self.pending.append(req)
            if self.transport is not None:
                self.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.too_large:
            return
        req.size += len(body)
        if req.size > self.max_body:
            req.too_large = True
            req.chunks.clear()
        else:
            req.chunks.append(body)
        req.wake()

    def on_message_complete(self) -> None:
        req = self.parsing
        if req is not None:
            self.parsing = None
            req.complete = True
            req.wake()

    # serving
    def _start(self, req: Request) -> None:
        self.current = req
        if not req.complete and not req.too_large and req.headers.get("expect", "").lower() == "100-continue":
            self.write(CONTINUE)
        self.task = self.loop.create_task(self._serve(req))

    async def _serve(self, req: Request) -> None:
        try:
            answer = await self.server.dispatch(req)
        except asyncio.CancelledError:
            return  # the client left, or the server is stopping
        except Exception:  # a bug in a handler: the client gets a 500, the connection stays usable
            self.server.log.exception("internal error on %s %s", req.method, req.path)
            answer = self.server.errors(500, f"internal {self.server.name} error", "internal_error")
        if not self.closed:
            self._answered(req, answer)

    def _answered(self, req: Request, answer: Answer) -> None:
        if isinstance(answer, Reply):
            keep = req.keep_alive and not answer.close and req.complete and not self.server.stopping
            self.write(answer.encode(keep, with_body=req.method != "HEAD"))
        else:  # a stream that did not end cleanly leaves the connection in no state to reuse
            keep = req.keep_alive and answer.finished and not self.server.stopping
        self.current = None
        self.task = None
        if not keep:
            self._finish(req)
            return
        if self.pending:
            nxt = self.pending.popleft()
            if not self.pending and self.transport is not None:
                self.transport.resume_reading()
            self._start(nxt)
        elif self.parsing is None:  # idle: the next request must come within the keep-alive timeout
            keepalive = self.server.keepalive_timeout
            self._arm(keepalive)
            self.idle = keepalive is not None

    def _finish(self, req: Request) -> None:
        """The last answer on this connection: close, after reading (and dropping) the unread body a while."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if req.complete:
            transport.close()
            return
        self.dropping = True
        with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
            if transport.can_write_eof():
                transport.write_eof()
        self.loop.call_later(LINGER, transport.close)

    def _malformed(self, exc: Exception) -> None:
        head = isinstance(exc.__context__, _HeadTooLarge)  # raised in on_url/on_header, wrapped by httptools
        reason = "request head too large" if head else " ".join(str(exc).split()) or type(exc).__name__
        self.dropping = True
        broken = self.parsing
        if broken is not None and broken is self.current:  # its handler answers when it reads the body
            broken.broken = reason
            broken.keep_alive = False
            broken.wake()
            self.pending.clear()
            return
        self.server.log.warning("bad HTTP request from %s: %s", self.peer or "?", reason)
        status = 431 if head else 400
        if self.current is None:  # else the request being served gets its answer, then the connection closes
            self.write(self.server.errors(status, f"bad HTTP request: {reason}", "invalid_request_error").encode(False))
            if self.transport is not None:
                self.transport.close()
        else:
            self.current.keep_alive = False
        self.pending.clear()

    # writing
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def send(self, data: bytes) -> None:
        """Writes, then waits while the client is not reading (its socket buffer full)."""
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        if data:
            self.write(data)
        if self.writable is not None:
            await asyncio.shield(self.writable)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # the header deadline
    def _arm(self, timeout: float | None = None) -> None:
        self._disarm()
        self.idle = False
        self.timer = self.loop.call_later(self.server.header_timeout if timeout is None else timeout, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.current is None and self.transport is not None:
            self.transport.close()


class Server:
    """Serves `routes` ((method, path) -> handler) on one address.

    `header_timeout` bounds how long a request's head may take to arrive and, unless
    `keepalive_timeout` says otherwise, how long an idle keep-alive connection stays (with it, the
    head's deadline starts at the next request's first byte); `max_connections` caps open
    connections (`on_busy` is called for each one turned away); `max_body` caps a body.
    `fallback` answers a request no route matches (else 404, or 405 naming the allowed methods);
    `errors` renders the errors the server writes itself (400, 404, 405, 431, 500, 503), `name`
    names the service in their messages, and `log` takes the line each malformed request or
    handler crash gets.
    """

    def __init__(
        self,
        routes: Routes,
        header_timeout: float = 15.0,
        max_connections: int = 4096,
        max_body: int = 32 << 20,
        on_busy: Callable[[], None] | None = None,
        *,
        keepalive_timeout: float | None = None,
        fallback: Handler | None = None,
        errors: ErrorReply = error_reply,
        name: str = "router",
        log: logging.Logger | None = None,
    ) -> None:
        self.routes = routes
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_connections = max_connections
        self.max_body = max_body
        self.on_busy = on_busy
        self.fallback = fallback
        self.errors = errors
        self.name = name
        self.log = log or logging.getLogger("xpyd_http")
        self.busy = busy_answer(errors, name)
        self.connections: set[Connection] = set()
        self.stopping = False
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None

    def _protocol(self) -> asyncio.BaseProtocol:
        if len(self.connections) >= self.max_connections or self.stopping:
            if self.on_busy is not None:
                self.on_busy()
            return _Busy(self.busy)
        return Connection(self)

    async def listen(self, host: str, port: int, backlog: int = 1024, tls: ssl.SSLContext | None = None) -> None:
        """With `tls`, HTTPS: the handshake gets the header deadline; a client speaking plain HTTP is cut off."""
        shake = self.header_timeout if tls is not None else None
        self._server = await self.loop.create_server(
            self._protocol, host, port, backlog=backlog, reuse_address=True, ssl=tls, ssl_handshake_timeout=shake
        )

    @property
    def port(self) -> int:
        sockets = self._server.sockets if self._server is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def dispatch(self, req: Request) -> Answer:
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.method == "HEAD":
            handler = self.routes.get(("GET", req.path))
        if handler is not None:
            return await handler(req)
        if self.fallback is not None:
            return await self.fallback(req)
        allowed = sorted(method for method, path in self.routes if path == req.path)
        if not allowed:
            return self.errors(404, f"no route {req.path}", "not_found_error")
        reply = self.errors(405, f"{req.method} is not allowed on {req.path}", "invalid_request_error")
        reply.headers = (*reply.headers, ("Allow", ", ".join(allowed)))
        return reply

    async def close(self, shutdown_timeout: float = 30.0) -> None:
        """Stops listening, closes idle connections, waits for in-flight requests, then cuts the rest."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.current is None and conn.transport is not None:
                conn.transport.close()
        tasks = [conn.task for conn in self.connections if conn.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=shutdown_timeout)
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)


__all__ = ["Connection", "ErrorReply", "Server", "Stream", "busy_answer"]
