"""Misbehaving workers for the fault cases, served in this process on 127.0.0.1: a black hole, a listener
that counts connections, and a worker that answers 200 with garbage."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from aiohttp import web
from bench.router.procs import free_port

HOST = "127.0.0.1"
METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
GOOD_EVENT = b'data: {"id": "g", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]}\n\n'
# What the garbage worker answers, in turn, with status 200: none of it is a valid OpenAI reply.
GARBAGE_JSON = (b'{"object": "garbage"}', b"\x00\x01garbage\xff", b"[1, 2, 3]", b"<html>oops</html>")
GARBAGE_SSE = (
    b"garbage\n\n",  # not an SSE field at all
    GOOD_EVENT + b"data: {not json\n\n",  # a good first event, then a broken one
    GOOD_EVENT,  # a good first event, then the stream ends without [DONE]
)


class Listener:
    """Accepts TCP on 127.0.0.1 (or `host`) and counts connections. `hold=True` keeps them open and silent
    (a black hole: the kernel completes the handshake, nothing ever answers); else each is closed at once."""

    def __init__(self, hold: bool, host: str = HOST) -> None:
        self.hold = hold
        self.host = host
        self.connections = 0
        self.requests = 0  # connections that sent an HTTP request line
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if not self.hold:
            writer.close()
            return
        self._held.append(writer)
        with contextlib.suppress(OSError):
            first = await reader.readline()
            if first.startswith((b"GET ", b"POST ")) and b" /v1/" in first:
                self.requests += 1
            while await reader.read(65536):  # read and drop whatever comes, answer nothing
                pass

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        for writer in self._held:
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()


class GarbageWorker:
    """Healthy on /health and /metrics; every completion is a 200 whose body is garbage: GARBAGE_JSON or
    GARBAGE_SSE in turn, from the first entry on."""

    def __init__(self) -> None:
        self.served = 0
        self._turns = {False: itertools.count(), True: itertools.count()}  # by streamed
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.served += 1
        try:
            streamed = (await request.json()).get("stream") is True
        except ValueError:
            streamed = False
        turn = next(self._turns[streamed])
        if not streamed:
            return web.Response(body=GARBAGE_JSON[turn % len(GARBAGE_JSON)], content_type="application/json")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(GARBAGE_SSE[turn % len(GARBAGE_SSE)])
        await out.write_eof()
        return out

    async def __aenter__(self) -> GarbageWorker:
        logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # its complaints about hops the router cut
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/health", self._ok)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        port = free_port(HOST)
        await web.TCPSite(self._runner, HOST, port).start()
        self.url = f"http://{HOST}:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @staticmethod
    async def _ok(_: web.Request) -> web.Response:
        return web.Response()

    @staticmethod
    async def _metrics(_: web.Request) -> web.Response:
        return web.Response(text=METRICS)


class SilentWorker:
    """Healthy on /health and /metrics, but never answers a completion: an engine wedged behind a live server."""

    def __init__(self) -> None:
        self.served = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _complete(self, _: web.Request) -> web.StreamResponse:
        self.served += 1
        await asyncio.Event().wait()  # until the router gives up on it and the connection closes
        raise AssertionError("unreachable")

    async def __aenter__(self) -> SilentWorker:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/health", GarbageWorker._ok)
        app.router.add_get("/metrics", GarbageWorker._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        port = free_port(HOST)
        await web.TCPSite(self._runner, HOST, port).start()
        self.url = f"http://{HOST}:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
