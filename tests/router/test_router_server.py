"""The listener (xpyd_http) on raw sockets: framing, keep-alive, pipelining, limits, streams, stopping, options."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpyd_http.messages import Answer, BodyError, Reply, Request, error_reply
from xpyd_http.server import MAX_HEAD_BYTES, Server

pytestmark = pytest.mark.timeout(30)
Serve = Callable[..., Any]


class Handlers:
    """Routes for the tests: an echo, a stream, a slow one; what each saw."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.cancelled = 0
        self.finished = 0
        self.release = asyncio.Event()
        self.chunks = 4
        self.chunk = b"data: x\n\n"

    async def echo(self, req: Request) -> Answer:
        try:
            body = await req.read()
        except BodyError as exc:
            return error_reply(exc.status, str(exc), "invalid_request_error")
        self.bodies.append(body)
        return Reply(200, orjson.dumps({"path": req.path, "query": req.query, "body": body.decode()}))

    async def stream(self, req: Request) -> Answer:
        out = req.stream({"Content-Type": "text/event-stream"})
        for _ in range(self.chunks):
            await out.write(self.chunk)
        await out.write_eof()
        self.finished += 1
        return out

    async def slow(self, req: Request) -> Answer:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return Reply(200, b'{"slow":true}')

    def routes(self) -> dict[tuple[str, str], Any]:
        return {
            ("POST", "/echo"): self.echo,
            ("GET", "/echo"): self.echo,
            ("GET", "/stream"): self.stream,
            ("GET", "/slow"): self.slow,
        }


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[Server] = []

    async def start(**options: Any) -> tuple[Server, Handlers, int]:
        handlers = Handlers()
        server = Server(handlers.routes(), **options)
        await server.listen("127.0.0.1", 0)
        servers.append(server)
        return server, handlers, server.port

    yield start
    for server in servers:
        await server.close(0.5)


async def exchange(port: int, data: bytes, wait: float = 2.0) -> bytes:
    """Sends `data`, half-closes, returns all the server sent until it closed (or `wait` passed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        async with asyncio.timeout(wait):
            while chunk := await reader.read(65536):
                out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    writer.close()
    return out


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One Content-Length answer: (head, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await reader.readexactly(length)


async def slow_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose request is in the slow handler (waiting for `release`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: r\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.1)
    return reader, writer


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


async def test_keep_alive_serves_requests_in_turn_on_one_connection(serve: Serve) -> None:
    _, handlers, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(3):
        writer.write(post("/echo", b'{"n":%d}' % i))
        head, body = await read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert orjson.loads(body)["body"] == f'{{"n":{i}}}'
    writer.close()
    assert len(handlers.bodies) == 3


async def test_pipelined_requests_are_answered_in_order(serve: Serve) -> None:
    _, _, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(post(f"/echo?i={i}", b"%d" % i) for i in range(5)))
    answers = [orjson.loads((await read_answer(reader))[1]) for _ in range(5)]
    writer.close()
    assert [a["query"]["i"] for a in answers] == ["0", "1", "2", "3", "4"]


async def test_a_chunked_body_arrives_whole(serve: Serve) -> None:
    _, handlers, port = await serve()
    data = b"POST /echo HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    data += b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    out = await exchange(port, data)
    assert out.startswith(b"HTTP/1.1 200")
    assert b"Connection: close" in out
    assert handlers.bodies == [b"hello world"]


async def test_expect_100_continue_is_answered_before_the_body(serve: Serve) -> None:
    _, handlers, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"{}")
    head, _ = await read_answer(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200") and handlers.bodies == [b"{}"]


@pytest.mark.parametrize(
    ("request_bytes", "status", "has_body"),
    [
        (b"GET /nowhere HTTP/1.1\r\nHost: r\r\n\r\n", b"404", True),
        (b"DELETE /echo HTTP/1.1\r\nHost: r\r\n\r\n", b"405", True),
        (b"HEAD /echo HTTP/1.1\r\nHost: r\r\n\r\n", b"200", False),
        (b"POST /echo HTTP/1.1\r\nHost: r\r\nContent-Length: 5000\r\n\r\n", b"413", True),
        (b"GET /echo HTTP/1.1\r\nHost: r\r\nX-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", b"431", True),
        (b"POST /echo HTTP/1.1\r\nHost: r\r\nContent-Length: nope\r\n\r\n", b"400", True),
        (b"NOT HTTP AT ALL\r\n\r\n", b"400", True),
        (b"POST /echo HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", b"400", True),
    ],
)
async def test_each_status_the_listener_gives_itself(
    request_bytes: bytes, status: bytes, has_body: bool, serve: Serve
) -> None:
    _, _, port = await serve(max_body=1000)
    out = await exchange(port, request_bytes + b"\r\n" if status == b"405" else request_bytes, wait=1.5)
    assert out.startswith(b"HTTP/1.1 " + status), out[:80]
    head, _, body = out.partition(b"\r\n\r\n")
    if status == b"405":
        assert b"Allow: GET, POST" in head
    if status in (b"404", b"405", b"400", b"431"):
        assert orjson.loads(body)["error"]["code"] == int(status)
    assert bool(body) is has_body


async def test_a_malformed_request_logs_one_line_and_the_server_serves_on(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, port = await serve()
    caplog.set_level(logging.WARNING, logger="xpyd_router")
    out = await exchange(port, b"GET / HTTP/1.1\r\nHost: r\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
    assert out.startswith(b"HTTP/1.1 400")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage() and warnings[0].exc_info is None
    assert (await exchange(port, post("/echo", b"ok", b"Connection: close\r\n"))).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
async def test_a_stream_on_a_closing_connection_ends_with_it(version: bytes, serve: Serve) -> None:
    _, handlers, port = await serve()
    out = await exchange(port, b"GET /stream HTTP/%s\r\nHost: r\r\nConnection: close\r\n\r\n" % version)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert body == handlers.chunk * handlers.chunks


async def test_a_kept_alive_stream_is_chunked_and_the_connection_serves_on(serve: Serve) -> None:
    _, handlers, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: r\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    events = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            break
        events += data[:-2]
    assert events == handlers.chunk * handlers.chunks
    writer.write(post("/echo", b"again"))
    assert (await read_answer(reader))[1].startswith(b'{"path":"/echo"')
    writer.close()


async def test_a_client_that_leaves_cancels_its_handler(serve: Serve) -> None:
    _, handlers, port = await serve()
    _, writer = await slow_request(port)
    writer.close()
    for _ in range(50):
        if handlers.cancelled:
            break
        await asyncio.sleep(0.02)
    assert handlers.cancelled == 1 and handlers.finished == 0


async def test_a_stream_to_a_client_that_does_not_read_waits_for_it(serve: Serve) -> None:
    _, handlers, port = await serve()
    handlers.chunk, handlers.chunks = b"x" * 65536, 400  # 26 MB: far beyond the socket buffers
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    await asyncio.sleep(0.5)
    assert handlers.finished == 0  # held back by the client, not buffered in the router
    got = 0
    while chunk := await reader.read(1 << 20):
        got += len(chunk)
    writer.close()
    assert handlers.finished == 1 and got > 400 * 65536


async def test_stopping_lets_in_flight_requests_finish_and_turns_new_ones_away(serve: Serve) -> None:
    server, handlers, port = await serve()
    reader, writer = await slow_request(port)
    closing = asyncio.create_task(server.close(5.0))
    await asyncio.sleep(0.1)
    handlers.release.set()
    head, body = await read_answer(reader)
    await closing
    writer.close()
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head and body == b'{"slow":true}'
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_stopping_cuts_requests_that_overrun_the_shutdown_timeout(serve: Serve) -> None:
    server, handlers, port = await serve()
    reader, writer = await slow_request(port)
    await server.close(0.2)
    assert await reader.read() == b""
    writer.close()
    await asyncio.sleep(0.05)
    assert handlers.cancelled == 1


STARTS = [b"POST /echo HTTP/1.1\r\n", b"GET /stream HTTP/1.0\r\n", b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\n"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.one_of(st.binary(max_size=300), st.tuples(st.sampled_from(STARTS), st.binary(max_size=200))))
async def test_any_bytes_get_an_answer_or_a_close_and_the_server_serves_on(
    junk: bytes | tuple[bytes, bytes], serve: Serve
) -> None:
    server, _, port = await serve(header_timeout=0.3)
    out = await exchange(port, junk if isinstance(junk, bytes) else b"".join(junk), wait=2.0)
    assert out == b"" or out.startswith(b"HTTP/1.1 "), out[:60]
    again = await exchange(port, post("/echo", b"ok", b"Connection: close\r\n"), wait=2.0)
    assert again.startswith(b"HTTP/1.1 200")
    await server.close(0.1)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (sending nothing more)."""
    try:
        async with asyncio.timeout(seconds):
            return await reader.read() == b""
    except TimeoutError:
        return False


async def test_without_a_keep_alive_timeout_an_idle_connection_gets_the_header_deadline(serve: Serve) -> None:
    _, _, port = await serve(header_timeout=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b"1"))
    await read_answer(reader)
    assert await closed_within(reader, 1.0)
    writer.close()


async def test_a_keep_alive_timeout_of_its_own_holds_idle_connections_past_the_header_deadline(serve: Serve) -> None:
    _, _, port = await serve(header_timeout=0.2, keepalive_timeout=0.8)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b"1"))
    await read_answer(reader)
    await asyncio.sleep(0.4)  # idle past the header deadline, within the keep-alive timeout
    writer.write(post("/echo", b"2"))
    head, body = await read_answer(reader)
    assert head.startswith(b"HTTP/1.1 200") and b'"body":"2"' in body
    writer.write(b"POST /echo HTTP/1.1\r\n")  # a head that stalls: the header deadline runs from its first byte
    assert await closed_within(reader, 0.5)
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b"3"))
    await read_answer(reader)
    assert not await closed_within(reader, 0.4)
    assert await closed_within(reader, 1.0)  # idle past the keep-alive timeout
    writer.close()


def teapot(status: int, message: str, kind: str) -> Reply:
    return Reply(status, orjson.dumps({"teapot": {"status": status, "message": message}}))


async def test_a_server_of_its_own_words_renders_its_errors_and_names_itself(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    mine = logging.getLogger("xpyd_test.listener")
    _, _, port = await serve(errors=teapot, name="worker", log=mine, max_connections=1)
    with caplog.at_level(logging.WARNING, logger="xpyd_test.listener"):
        out = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert orjson.loads(out.partition(b"\r\n\r\n")[2])["teapot"]["status"] == 400
    assert [r.name for r in caplog.records] == ["xpyd_test.listener"]
    out = await exchange(port, b"GET /nowhere HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    assert orjson.loads(out.partition(b"\r\n\r\n")[2])["teapot"]["status"] == 404
    _, idle = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.05)
    out = await exchange(port, b"")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head and b"Connection: close" in head
    assert orjson.loads(body)["teapot"] == {
        "status": 503,
        "message": "too many connections to the worker; retry shortly",
    }
    idle.close()


async def test_a_fallback_answers_what_no_route_matches(serve: Serve) -> None:
    async def fallback(req: Request) -> Answer:
        return Reply(200, b"fallback " + req.method.encode() + b" " + req.path.encode())

    _, _, port = await serve(fallback=fallback)
    for line, body in [(b"GET /rooms/7", b"fallback GET /rooms/7"), (b"DELETE /echo", b"fallback DELETE /echo")]:
        out = await exchange(port, line + b" HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(body)
    assert b'"body":"x"' in await exchange(port, post("/echo", b"x", b"Connection: close\r\n"))  # routes come first


async def test_a_started_stream_sends_its_head_before_the_first_event() -> None:
    go = asyncio.Event()

    async def events(req: Request) -> Answer:
        out = req.stream({"Content-Type": "text/event-stream"})
        await out.start()
        await go.wait()
        await out.write(b"data: 1\n\n")
        await out.write_eof()
        return out

    server = Server({("GET", "/events"): events})
    await server.listen("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /events HTTP/1.1\r\nHost: r\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    go.set()
    assert await reader.readuntil(b"0\r\n\r\n") == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
    writer.close()
    await server.close(0.5)
