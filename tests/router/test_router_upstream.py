"""The lean upstream HTTP client against a real aiohttp server: keep-alive, chunks, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from router_harness import free_port  # type: ignore[import-not-found]

from xpyd_router.http.upstream import Upstream, UpstreamError


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    peers: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        peers.append(str(request.transport.get_extra_info("peername") if request.transport else ""))
        return web.json_response({"got": (await request.json())["x"]}, status=201)

    async def stream(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(3):
            await out.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.01)
        if request.query.get("break"):
            assert request.transport is not None
            request.transport.close()
            return out
        await out.write_eof()
        return out

    async def bye(request: web.Request) -> web.Response:
        return web.Response(text="bye", headers={"Connection": "close"})

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_post("/stream", stream)
    app.router.add_post("/bye", bye)
    runner = web.AppRunner(app, keepalive_timeout=0.2)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", peers
    await runner.cleanup()


async def test_keep_alive_reuses_one_connection(server: tuple[str, list[str]]) -> None:
    url, peers = server
    client = Upstream()
    for i in range(3):
        resp = await client.post(url, "/echo", b'{"x": %d}' % i)
        assert resp.status == 201
        assert resp.content_type.startswith("application/json")
        assert await resp.read() == b'{"got": %d}' % i
        resp.close()
    assert len(set(peers)) == 1
    client.close()


async def test_stale_kept_alive_connection_is_replaced(server: tuple[str, list[str]]) -> None:
    url, peers = server
    client = Upstream()
    (await client.post(url, "/echo", b'{"x": 1}')).close()
    await asyncio.sleep(0.5)  # the server's keep-alive timeout closes the idle connection
    resp = await client.post(url, "/echo", b'{"x": 2}')
    assert await resp.read() == b'{"got": 2}'
    resp.close()
    assert len(set(peers)) == 2
    client.close()


async def test_chunks_arrive_one_by_one_and_close_header_is_honoured(server: tuple[str, list[str]]) -> None:
    url, _ = server
    client = Upstream()
    resp = await client.post(url, "/stream", b"{}")
    assert [c async for c in resp.chunks()] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    resp.close()
    resp = await client.post(url, "/bye", b"{}")
    assert await resp.read() == b"bye"
    resp.close()
    assert not any(client.idle.values())  # Connection: close is not pooled
    client.close()


async def test_broken_stream_and_refused_connection_raise(server: tuple[str, list[str]]) -> None:
    url, _ = server
    client = Upstream()
    resp = await client.post(url, "/stream?break=1", b"{}")
    with pytest.raises(UpstreamError, match="lost") as info:
        _ = [c async for c in resp.chunks()]
    assert info.value.started
    resp.close()
    with pytest.raises(UpstreamError, match="cannot connect"):
        await client.post(f"http://127.0.0.1:{free_port('127.0.0.1')}", "/echo", b"{}")
    client.close()


@pytest.mark.parametrize("answer_headers", [False, True])
async def test_a_silent_worker_fails_the_hop_after_the_read_timeout(answer_headers: bool) -> None:
    """A worker that accepts and then says nothing (before or after its headers) cannot hold a request forever."""
    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer_headers:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
        await done.wait()
        writer.close()
        await writer.wait_closed()

    async def call(client: Upstream, url: str) -> bytes:
        resp = await client.post(url, "/v1/completions", b"{}")
        try:
            return await resp.read()
        finally:
            resp.close()

    port = free_port("127.0.0.1")
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    client = Upstream(first_byte_timeout=0.3, idle_timeout=0.3)
    try:
        with pytest.raises(UpstreamError, match=r"0\.3s"):
            await call(client, f"http://127.0.0.1:{port}")
    finally:
        done.set()
        client.close()
        server.close()
        await server.wait_closed()


CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Scripted:
    """A worker that writes each piece after its pause, then holds the connection open."""

    def __init__(self, script: list[tuple[float, bytes]]) -> None:
        self.script = script
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.play, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def play(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            for pause, data in self.script:
                await asyncio.sleep(pause)
                writer.write(data)
            await reader.read()
        finally:
            writer.close()
            self.tasks.discard(task)


@pytest.mark.parametrize(
    ("script", "first_byte", "error"),
    [
        # a steady trickle inside the idle budget never trips it, however long it lasts
        ([(0, CHUNKED)] + [(0.1, chunk(b"x"))] * 8 + [(0.1, b"0\r\n\r\n")], True, None),
        # a stall after the first chunk: the idle budget, not the (longer) first-byte one
        ([(0, CHUNKED + chunk(b"x"))], True, "no data from .* within 0.3s"),
        # headers alone are no first byte
        ([(0, CHUNKED)], True, "no first byte from .* within 0.6s"),
        # a non-streamed reply may be silent past the first-byte budget (the request deadline bounds it)
        ([(0.8, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")], False, None),
        ([(0.8, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")], True, "no first byte"),
    ],
)
async def test_the_watchdog(script: list[tuple[float, bytes]], first_byte: bool, error: str | None) -> None:
    client = Upstream(first_byte_timeout=0.6, idle_timeout=0.3)
    async with Scripted(script) as url:
        try:
            if error is None:
                resp = await client.post(url, "/x", b"{}", first_byte=first_byte)
                assert await resp.read() in (b"x" * 8, b"{}")
                resp.close()
            else:
                with pytest.raises(UpstreamError, match=error) as info:
                    await read_all(client, url, first_byte)
                assert info.value.worker_down
        finally:
            client.close()


async def read_all(client: Upstream, url: str, first_byte: bool) -> bytes:
    resp = await client.post(url, "/x", b"{}", first_byte=first_byte)
    try:
        return await resp.read()
    finally:
        resp.close()


async def test_an_oversized_reply_is_refused_as_a_bad_answer() -> None:
    client = Upstream()
    async with Scripted([(0, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100)]) as url:
        try:
            resp = await client.post(url, "/x", b"{}")
            with pytest.raises(UpstreamError, match="larger than 10 bytes") as info:
                await resp.read(limit=10)
            assert not info.value.worker_down
            resp.close()
        finally:
            client.close()


async def test_a_rank_target_pins_the_rank_on_the_shared_connection() -> None:
    """A data-parallel rank's target sends vLLM's X-data-parallel-rank; the worker itself sends none;
    all targets of one server share its kept-alive connections."""
    seen: list[tuple[str | None, str]] = []

    async def echo(request: web.Request) -> web.Response:
        peer = str(request.transport.get_extra_info("peername") if request.transport else "")
        seen.append((request.headers.get("X-data-parallel-rank"), peer))
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/completions", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        client = Upstream()
        for target in (f"http://127.0.0.1:{port}#dp3", f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}#dp0"):
            resp = await client.post(target, "/v1/completions", b"{}")
            await resp.read()
            resp.close()
        client.close()
    finally:
        await runner.cleanup()
    assert [rank for rank, _ in seen] == ["3", None, "0"]
    assert len({peer for _, peer in seen}) == 1
