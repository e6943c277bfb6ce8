"""The emulator's listening sockets, on the router's listener (xpyd_http): their limits and vLLM's errors.

Each socket the emulator opens (the API port, the NIXL side channel, SGLang's bootstrap server, a
member rank's dummy /health) is an xpyd_http.Server with the same limits: a connection must deliver
complete request headers within `header_timeout` of connecting (or of its first byte after a
keep-alive pause), idle keep-alive connections close after `keepalive_timeout` (longer than the
router's 60 s pool keep-alive, so the router never reuses a connection the worker is closing),
connections past `max_connections` are answered 503 and closed, a body over `max_body_bytes` gets
413 and one not received within `body_timeout` 408, and HTTP that cannot be parsed gets an
OpenAI-style 400 and one log line. Handlers raise ApiError; `guarded` turns it (or a crash) into
vLLM's error body.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from xpyd_emulator.errors import ApiError, error_body
from xpyd_http.messages import Answer, BodyError, BodyTooLarge, Reply, Request
from xpyd_http.server import Server

log = logging.getLogger("xpyd.emulator")
BACKLOG = 2048
Handler = Callable[[Request], Awaitable[Answer]]


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


def json_error(exc: ApiError) -> Reply:
    """vLLM's error body; a 408, 413 or 503 closes the connection (a body left unread, a client to send elsewhere)."""
    return Reply(exc.status, exc.body(), close=exc.status in (408, 413, 503))


def server_error(status: int, message: str, kind: str) -> Reply:
    """The errors the listener writes itself (malformed HTTP, over the connection cap), in vLLM's shape."""
    return Reply(status, error_body(message, status))


def guarded(handler: Handler) -> Handler:
    """`handler`, its ApiErrors (and unreadable bodies) answered as vLLM's errors, a crash as a 500 and one log line."""

    async def serve(request: Request) -> Answer:
        try:
            return await handler(request)
        except ApiError as exc:
            log.info("%d %s %s: %s", exc.status, request.method, request.path[:100], exc.message)
            return json_error(exc)
        except BodyError as exc:
            log.info("%d %s %s: %s", exc.status, request.method, request.path[:100], exc)
            return json_error(ApiError(str(exc), exc.status))
        except ConnectionError as exc:  # the client went away: nothing to tell anyone
            log.debug("client of %s %s went away: %s", request.method, request.path[:100], exc)
            return Reply(close=True)
        except Exception:
            log.exception("500 for %s %s", request.method, request.path[:100])
            return json_error(ApiError("internal error; see the worker's log", 500))

    return serve


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request body within the size and time limits; raises ApiError 400, 408 or 413."""
    length = request.header("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
        raise ApiError(f"request body of {length} bytes is over the {limits.max_body_bytes}-byte limit.", 413)
    try:
        async with asyncio.timeout(limits.body_timeout):
            return await request.read()
    except TimeoutError:
        raise ApiError(f"request body not received within {limits.body_timeout:g} s.", 408) from None
    except BodyTooLarge:
        raise ApiError(f"request body is over the {limits.max_body_bytes}-byte limit.", 413) from None
    except BodyError as exc:
        raise ApiError(str(exc), exc.status) from None


def make_server(
    routes: dict[tuple[str, str], Handler], limits: Limits, max_body: int | None = None, fallback: Handler | None = None
) -> Server:
    """A listener for `routes` ((method, path) -> handler; HEAD is served by GET's) within `limits`;
    `fallback` answers what no route matches (else 404, or 405 naming the allowed methods)."""

    def busy() -> None:
        log.info("503: over --max-connections %d", limits.max_connections)

    return Server(
        {key: guarded(handler) for key, handler in routes.items()}, limits.header_timeout, limits.max_connections,
        limits.max_body_bytes if max_body is None else max_body, on_busy=busy,
        keepalive_timeout=limits.keepalive_timeout, fallback=guarded(fallback) if fallback is not None else None,
        errors=server_error, name="worker", log=log,
    )  # fmt: skip
