"""Limits on the emulator's listening sockets: header and body timeouts, body size, connection cap.

aiohttp has no header read timeout (a slowloris client holds a connection for its whole
keep-alive time, an hour by default) and no connection cap, so each site here builds its own
protocol handler: a connection must deliver complete request headers within `header_timeout`
of connecting (or of its first byte after a keep-alive pause), idle keep-alive connections
close after `keepalive_timeout` (longer than the router's 60 s pool keep-alive, so the router
never reuses a connection the worker is closing), connections past `max_connections` are
answered 503 and closed, and HTTP that cannot be parsed gets an OpenAI-style 400 and one log
line rather than aiohttp's traceback.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from xpyd_emulator.errors import ApiError, error_body
from xpyd_emulator.peers import url_host

log = logging.getLogger("xpyd.emulator")
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body_bytes: int = 16 << 20
    max_connections: int = 4096
    keepalive_timeout: float = 75.0


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to fit the process's open-file limit (with room for listeners and KV pulls)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - 64 >= wanted:
        return wanted
    log.info("--max-connections %d lowered to %d to fit the open-file limit (%d)", wanted, max(16, soft - 64), soft)
    return max(16, soft - 64)


class Guard:
    """Counts one site's open connections against its cap."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        self.refused = 0


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler plus the header deadline, the connection cap and JSON HTTP errors."""

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, guard: Guard, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self.guard = guard
        self.counted = False
        self.over_cap = False
        self.in_request = False
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        guard = self.guard
        if guard.open >= 2 * guard.limits.max_connections:  # far over the cap: not even a reply
            guard.refused += 1
            self.force_close()
            return
        self.counted = True
        guard.open += 1
        self.over_cap = guard.open > guard.limits.max_connections
        self.arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.disarm()
        if self.counted:
            self.counted = False
            self.guard.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.in_request and self.header_timer is None:
            self.arm()
        super().data_received(data)

    def arm(self) -> None:
        timeout = min(1.0, self.guard.limits.header_timeout) if self.over_cap else self.guard.limits.header_timeout
        self.header_timer = asyncio.get_running_loop().call_later(timeout, self.headers_late)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def headers_late(self) -> None:
        self.header_timer = None
        if not self.in_request and self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            log.info("closed a connection from %s: no complete request headers within %g s", peer,
                     self.guard.limits.header_timeout)  # fmt: skip
            self.force_close()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """HTTP aiohttp could not parse (or a handler crash): one log line, an OpenAI-style body."""
        reason = " ".join((message or str(exc or "") or "error").split())[:200]
        if isinstance(exc, ConnectionError):  # the client left mid-response: nothing to tell anyone
            log.debug("client of %s %s went away: %s", request.method, request.path, reason)
        elif status >= 500:
            log.error("%d for %s %s: %s", status, request.method, request.path, reason, exc_info=exc)
            reason = "internal error; see the worker's log"
        else:
            log.info("%d malformed HTTP request from %s: %s", status, request.remote, reason)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; closing the connection")
        resp = web.Response(status=status, body=error_body(reason, status), content_type=_JSON)
        resp.force_close()
        return resp


def json_error(exc: ApiError) -> web.Response:
    resp = web.Response(status=exc.status, body=exc.body(), content_type=_JSON)
    if exc.status in (408, 413, 503):
        resp.force_close()  # body left unread, or a client to send elsewhere
    return resp


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks a request in progress (its headers arrived), turns every error into an OpenAI-style body."""
    proto = request.protocol if isinstance(request.protocol, GuardedHandler) else None
    if proto is not None:
        proto.in_request = True
        proto.disarm()
        if proto.over_cap:
            proto.in_request = False
            log.info("503 for %s: over --max-connections %d", request.remote, proto.guard.limits.max_connections)
            return json_error(ApiError("too many connections to this worker; retry shortly.", 503))
    try:
        return await handler(request)
    except ApiError as exc:
        log.info("%d %s %s: %s", exc.status, request.method, request.path, exc.message)
        return json_error(exc)
    except ConnectionError:  # the client went away; aiohttp closes the connection quietly
        raise
    except web.HTTPException as exc:  # aiohttp's own (e.g. 413 from request.read())
        log.info("%d %s %s: %s", exc.status, request.method, request.path, exc.reason)
        return json_error(ApiError(exc.reason, exc.status))
    except Exception:
        log.exception("500 for %s %s", request.method, request.path)
        return json_error(ApiError("internal error; see the worker's log", 500))
    finally:
        if proto is not None:
            proto.in_request = False


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The request body within the size and time limits; raises ApiError 408 or 413."""
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise ApiError(f"request body of {request.content_length} bytes is over the {limits.max_body_bytes}-byte "
                       "limit.", 413)  # fmt: skip
    try:
        async with asyncio.timeout(limits.body_timeout):
            return await request.read()
    except TimeoutError:
        raise ApiError(f"request body not received within {limits.body_timeout:g} s.", 408) from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(f"request body is over the {limits.max_body_bytes}-byte limit.", 413) from None


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are GuardedHandlers (the runner must be set up first)."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: Limits, backlog: int = 2048) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._guard = Guard(limits)

    @property
    def guard(self) -> Guard:
        return self._guard

    @property
    def name(self) -> str:
        return f"http://{url_host(self._host)}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        limits = self._guard.limits

        def factory() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=self._guard, access_log=None,
                                  keepalive_timeout=limits.keepalive_timeout, lingering_time=1.0)  # fmt: skip

        self._server = await loop.create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
