"""One request and its answer, as the handlers of a route table see them (xpyd_http.server serves them)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from xpyd_http.errors import error_body

if TYPE_CHECKING:
    from xpyd_http.server import Connection

JSON = "application/json"


class BodyError(Exception):
    """The request body cannot be had: `status` is the answer."""

    status = 400


class BodyTooLarge(BodyError):
    """The request body is over the server's limit (its `max_body`: the router's --max-body-bytes, say)."""

    status = 413


class MalformedBody(BodyError):
    """The body's framing broke (a bad chunk size, say): the rest of the body cannot be read."""


def status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode())


_line = functools.cache(status_line)


@dataclass(slots=True)
class Reply:
    """A whole answer: written in one piece, with its length."""

    status: int = 200
    body: bytes = b""
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # end the connection after it (the request body may be unread)

    def encode(self, keep_alive: bool, with_body: bool = True) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in self.headers)
        close = "" if keep_alive else "Connection: close\r\n"
        head = f"Content-Type: {self.content_type}\r\nContent-Length: {len(self.body)}\r\n{extra}{close}\r\n"
        return b"".join((_line(self.status), head.encode("latin-1"), self.body if with_body else b""))


def error_reply(status: int, message: str, kind: str, param: str | None = None) -> Reply:
    return Reply(status, error_body(message, kind, status, param))


class Stream:
    """An answer sent as it is made (server-sent events): chunked framing on HTTP/1.1; on HTTP/1.0,
    the connection's end ends it. Its head goes out with the first event, in the same write."""

    status = 200

    def __init__(self, conn: Connection, headers: dict[str, str], chunked: bool) -> None:
        self._conn = conn
        self._chunked = chunked
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        framing = "Transfer-Encoding: chunked\r\n" if chunked else "Connection: close\r\n"
        self._head: bytes | None = _line(200) + (lines + framing + "\r\n").encode("latin-1")
        self.finished = False

    async def start(self) -> None:
        """Sends the head now rather than with the first event (an engine answers the head at once)."""
        if self._head is not None:
            await self._send(b"")

    async def write(self, data: bytes) -> None:
        if not data:
            return
        if self._chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        await self._send(data)

    async def write_eof(self) -> None:
        if self.finished:
            return
        await self._send(b"0\r\n\r\n" if self._chunked else b"")
        self.finished = True

    async def _send(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        await self._conn.send(data)


Answer = Reply | Stream


class Request:
    """A parsed request: its head at once, its body as it arrives (read() waits for all of it)."""

    __slots__ = (
        "_conn", "_waiter", "broken", "chunks", "complete", "headers", "keep_alive", "method", "path", "query_string",
        "size", "too_large", "version",
    )  # fmt: skip

    def __init__(self, conn: Connection, method: str, target: str, headers: dict[str, str], version: str) -> None:
        self._conn = conn
        self.method = method
        self.path, _, self.query_string = target.partition("?")
        self.headers = headers  # names in lower case
        self.version = version
        self.keep_alive = True
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = False
        self.too_large = False
        self.broken: str | None = None  # why the body's framing broke
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.query_string))

    @property
    def remote(self) -> str:
        return self._conn.peer

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._conn.transport

    def abort(self) -> None:
        """Cuts the connection (a client that will not read its answer)."""
        self._conn.abort()

    def stream(self, headers: dict[str, str]) -> Stream:
        """Opens the streamed answer; without chunked framing (HTTP/1.0) the connection's close ends it."""
        chunked = self.version == "1.1" and self.keep_alive
        self.keep_alive = chunked
        return Stream(self._conn, headers, chunked)

    async def read(self) -> bytes:
        """The whole body; BodyTooLarge past the limit, MalformedBody if its framing broke,
        ConnectionResetError if the client left first."""
        while not self.complete and not self.too_large and self.broken is None:
            if self._conn.closed:
                raise ConnectionResetError("the client closed the connection before sending its body")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.too_large:
            raise BodyTooLarge(f"request body too large: over the {self._conn.max_body}-byte limit")
        if self.broken is not None:
            raise MalformedBody(f"malformed request body: {self.broken}")
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


Handler = Callable[[Request], Awaitable[Answer]]
Routes = dict[tuple[str, str], Handler]  # (method, path)
