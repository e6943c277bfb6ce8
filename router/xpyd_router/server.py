"""The client-facing listener: a cap on connections, a header deadline, one log line per bad request.

aiohttp's keep-alive timer runs from the moment a connection opens (or its last response ends) until
the next request's headers are complete, and closes the connection if they are not by then; so
`header_timeout` is both the slowloris bound and how long an idle keep-alive connection may stay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from xpyd_router.protocol import error_body

_BUSY_BODY = error_body("too many connections to the router; retry shortly", "service_unavailable", 503)
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class _OneLine(logging.Filter):
    """aiohttp logs a traceback for every malformed HTTP request; one line is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = " ".join(str(exc.message or type(exc).__name__).split())
            record.msg = f"{record.getMessage()}: {reason}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _OneLine) for f in server_log.filters):
        server_log.addFilter(_OneLine())


def make_runner(app: web.Application, header_timeout: float, shutdown_timeout: float = 30.0) -> web.AppRunner:
    quiet_bad_requests()
    return web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=header_timeout,
        lingering_time=1.0,  # after an early answer (408, 413), read the unread body this long at most
    )


class _Busy(asyncio.Protocol):
    """Past the connection cap: a 503 and goodbye, without reading the request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(BUSY)  # type: ignore[attr-defined]
        transport.close()


class _Gate:
    """The protocol factory: aiohttp's request handler while under the cap, else _Busy."""

    def __init__(self, server: web.Server, limit: int, on_busy: Callable[[], None] | None) -> None:
        self.server = server
        self.limit = limit
        self.on_busy = on_busy

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self.server.connections) >= self.limit:
            if self.on_busy is not None:
                self.on_busy()
            return _Busy()
        return self.server()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections beyond `max_connections` are answered 503 and closed."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int,
        backlog: int = 1024,
        on_busy: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._limit = max_connections
        self._on_busy = on_busy

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        server = self._server
        sockets = getattr(server, "sockets", None)
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        gate = _Gate(server, self._limit, self._on_busy)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(gate, self._host, self._port, backlog=self._backlog, reuse_address=True)
