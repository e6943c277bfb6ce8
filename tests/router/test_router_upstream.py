"""The lean upstream HTTP client against a real aiohttp server: keep-alive, chunks, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from router_harness import free_port  # type: ignore[import-not-found]

from xpyd_router.upstream import Upstream, UpstreamError


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
    client = Upstream(read_timeout=0.3)
    try:
        with pytest.raises(UpstreamError, match=r"0\.3s"):
            await call(client, f"http://127.0.0.1:{port}")
    finally:
        done.set()
        client.close()
        server.close()
        await server.wait_closed()
