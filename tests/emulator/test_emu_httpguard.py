"""The emulator's sockets: slowloris, slow and oversized bodies, the connection cap, OpenAI-style errors."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
import pytest
from emu_harness import make_config, running  # type: ignore[import-not-found]

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
