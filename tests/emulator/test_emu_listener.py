"""The emulator's sockets on xpyd_http: slowloris, keep-alive, slow and oversized bodies, the cap, OpenAI errors."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
import pytest
from emu_harness import make_config, running  # type: ignore[import-not-found]

from xpyd_emulator.bootstrap import RoomTable, bootstrap_server
from xpyd_emulator.listener import Limits
from xpyd_emulator.peers import PeerPolicy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOST = "127.0.0.31"


async def exchange(port: int, *chunks: bytes, pause: float = 0.0, wait: float = 5.0) -> tuple[bytes, float]:
    """Send chunks (pausing between them) on a raw connection; returns all bytes read until EOF and the time."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(pause)
        data = await asyncio.wait_for(reader.read(), wait)
    except ConnectionResetError:
        data = b""
    finally:
        writer.close()
    return data, time.perf_counter() - start


def error_of(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)["error"]


async def test_slowloris_and_idle_connections_are_cut() -> None:
    cfg = make_config(HOST, MODEL, header_timeout=0.3)
    async with running(cfg):
        drip = [b"POST /v1/completions HTTP/1.1\r\n", *[b"X-Drip: 1\r\n"] * 20]
        data, took = await exchange(cfg.port, *drip, pause=0.1)
        assert (data, took < 1.5) == (b"", True)
        data, took = await exchange(cfg.port)  # connects, never sends
        assert (data, took < 1.5) == (b"", True)


async def test_an_idle_keep_alive_connection_outlives_the_header_deadline() -> None:
    """The router pools worker connections for 60 s: the worker must not close an idle one at the header deadline."""
    cfg = make_config(HOST, MODEL, header_timeout=0.3)
    async with running(cfg):
        reader, writer = await asyncio.open_connection(HOST, cfg.port)
        for _ in range(2):
            writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            assert b"xpyd.emulator" in await reader.readexactly(length)
            await asyncio.sleep(0.6)  # idle past the header deadline
        writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"", 408, "not received"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413, "5000 bytes"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"800\r\n" + b"a" * 2048 + b"\r\n0\r\n\r\n", 413, "limit"),
        (b"GARBAGE\r\n\r\n", 400, ""),
        (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "use POST"),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, "no route"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, ""),
    ],
)  # fmt: skip
async def test_bad_http_gets_an_openai_error_and_one_log_line(
    request_bytes: bytes, status: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(HOST, MODEL, body_timeout=0.3, max_body_bytes=1000)
    async with running(cfg):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="xpyd.emulator"):
            data, _ = await exchange(cfg.port, request_bytes)
        code, error = error_of(data)
        assert code == status
        assert (error["code"], message in error["message"]) == (status, True)
        assert set(error) == {"message", "type", "param", "code"}
        lines = [r for r in caplog.records if r.name == "xpyd.emulator" and r.levelno >= logging.INFO]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert lines[0].exc_info is None


async def test_connection_cap_answers_503_then_recovers() -> None:
    cfg = make_config(HOST, MODEL, max_connections=3, header_timeout=5.0)
    async with running(cfg):
        idle = [await asyncio.open_connection(HOST, cfg.port) for _ in range(3)]
        await asyncio.sleep(0.05)
        ask = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n{"prompt":"x"}'
        data, _ = await exchange(cfg.port, ask)
        assert error_of(data)[0] == 503
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.05)
        data, _ = await exchange(cfg.port, ask.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n"))
        assert data.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{\"prompt\": \"x\",}", None),
        (b"\xff\xfe", None),
        (b"[" * 5000, None),
        (b"null", None),
        (b"{}", "prompt"),
        (b"{\"prompt\": 5}", "prompt"),
        (b"{\"prompt\": \"x\", \"max_tokens\": 1.5}", "max_tokens"),
        (b"{\"prompt\": \"x\", \"max_tokens\": 99999999999999999999999}", "max_tokens"),
        (b"{\"prompt\": \"x\", \"max_tokens\": 9999999}", "input_tokens"),
        (b"{\"prompt\": \"x\", \"model\": [1]}", "model"),
        (b"{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature"),
        (b"{\"prompt\": \"x\", \"stream\": 1}", "stream"),
        (b"{\"prompt\": \"x\", \"kv_transfer_params\": \"yes\"}", "kv_transfer_params"),
        (b"{\"messages\": \"hi\"}", "messages"),
    ],
)  # fmt: skip
async def test_malformed_bodies_get_openai_errors(body: bytes, param: str | None) -> None:
    cfg = make_config(HOST, MODEL)
    async with running(cfg):
        path = b"/v1/chat/completions" if b"messages" in body else b"/v1/completions"
        head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        data, _ = await exchange(cfg.port, head % len(body) + body)
        status, error = error_of(data)
        assert (status, error["type"], error["code"], error["param"]) == (400, "BadRequestError", 400, param)


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (b"GET /xpyd/bootstrap/room/7?timeout=0 HTTP/1.1\r\n", 404, "never prefilled"),
        (b"GET /xpyd/bootstrap/room/seven HTTP/1.1\r\n", 400, "must be numbers"),
        (b"GET /xpyd/bootstrap/room/7?timeout=9999 HTTP/1.1\r\n", 400, "timeout in [0, 600]"),
        (b"GET /xpyd/bootstrap/room/ HTTP/1.1\r\n", 404, "no route"),
        (b"GET /xpyd/bootstrap/room/7/x HTTP/1.1\r\n", 404, "no route"),
        (b"GET /elsewhere HTTP/1.1\r\n", 404, "no route"),
        (b"POST /xpyd/bootstrap/room/7 HTTP/1.1\r\nContent-Length: 0\r\n", 405, "use GET"),
    ],
)  # fmt: skip
async def test_the_bootstrap_server_answers_by_path(request_bytes: bytes, status: int, message: str) -> None:
    server = bootstrap_server(RoomTable(5.0), PeerPolicy.parse("127.0.0.1"), Limits())
    await server.listen(HOST, 0)
    try:
        data, _ = await exchange(server.port, request_bytes + b"Host: x\r\nConnection: close\r\n\r\n")
    finally:
        await server.close(1.0)
    code, error = error_of(data)
    assert (code, error["code"], message in error["message"]) == (status, status, True), error


async def test_the_bootstrap_server_hands_a_published_room_to_a_peer_once() -> None:
    rooms = RoomTable(5.0)
    rooms.publish(7, {"tokens": 12}, asyncio.get_running_loop().time())
    server = bootstrap_server(rooms, PeerPolicy.parse("127.0.0.1"), Limits())
    await server.listen(HOST, 0)
    ask = b"GET /xpyd/bootstrap/room/7?timeout=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        first, _ = await exchange(server.port, ask)
        again, _ = await exchange(server.port, ask)
    finally:
        await server.close(1.0)
    assert first.startswith(b"HTTP/1.1 200") and orjson.loads(first.partition(b"\r\n\r\n")[2]) == {"tokens": 12}
    assert error_of(again)[0] == 404


async def test_the_bootstrap_server_refuses_other_hosts() -> None:
    server = bootstrap_server(RoomTable(5.0), PeerPolicy.parse("127.0.0.2"), Limits())
    await server.listen(HOST, 0)
    try:
        data, _ = await exchange(
            server.port, b"GET /xpyd/bootstrap/room/7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    finally:
        await server.close(1.0)
    code, error = error_of(data)
    assert (code, "not a KV peer" in error["message"]) == (403, True)
