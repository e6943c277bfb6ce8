"""Hostile clients: slowloris headers and bodies, connection floods, API keys, quiet logs, no leaked addresses."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from router_harness import Router  # type: ignore[import-not-found]
from stub_workers import Stub, call  # type: ignore[import-not-found]

from xpyd_router.http.access import ApiKey, load_api_keys

pytestmark = pytest.mark.timeout(30)
Start = Callable[..., Any]
REQUEST_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"


async def one_worker(stubs: Start, router: Start, **config: Any) -> tuple[Router, Stub]:
    worker = await stubs("worker")
    return await router([worker], scrape_interval=60, **config), worker


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection; fails if it is still open after `seconds`."""
    async with asyncio.timeout(seconds):
        data = b""
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def port_of(r: Router) -> int:
    return int(r.url.rsplit(":", 1)[1])


async def test_slowloris_headers_are_cut_off(stubs: Start, router: Start) -> None:
    r, worker = await one_worker(stubs, router, header_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(r))
    start = time.monotonic()

    async def trickle() -> None:
        for byte in REQUEST_HEAD:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    try:
        await closed_within(reader, 8)
    finally:
        task.cancel()
        writer.close()
    assert time.monotonic() - start < 6  # 0.5 s, not the 75 s of aiohttp's default
    assert worker.calls == 0


async def test_a_trickled_body_gets_408(stubs: Start, router: Start) -> None:
    r, worker = await one_worker(stubs, router, body_timeout=0.4)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(r))
    writer.write(REQUEST_HEAD + b"Content-Length: 200\r\n\r\n{")
    start = time.monotonic()

    async def trickle() -> None:
        for _ in range(100):
            writer.write(b" ")
            await asyncio.sleep(0.1)

    task = asyncio.create_task(trickle())
    try:
        data = await closed_within(reader, 8)
    finally:
        task.cancel()
        writer.close()
    assert data.startswith(b"HTTP/1.1 408")
    assert b"request body not received" in data
    assert time.monotonic() - start < 6  # 0.4 s, then at most 1 s reading what is left of the body
    assert worker.calls == 0


async def test_a_body_whose_framing_breaks_gets_400_at_once(stubs: Start, router: Start) -> None:
    r, worker = await one_worker(stubs, router, body_timeout=20)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(r))
    writer.write(REQUEST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    try:
        data = await closed_within(reader, 8)  # not the 20 s body timeout
    finally:
        writer.close()
    assert data.startswith(b"HTTP/1.1 400")
    assert b"malformed request body" in data
    assert worker.calls == 0


async def test_connections_beyond_the_cap_get_503_and_idle_ones_are_closed(stubs: Start, router: Start) -> None:
    r, _ = await one_worker(stubs, router, max_connections=3, header_timeout=0.6)
    held = [await asyncio.open_connection("127.0.0.1", port_of(r)) for _ in range(3)]
    await asyncio.sleep(0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(r))
    data = await closed_within(reader, 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 503")
    assert orjson.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "service_unavailable"
    start = time.monotonic()
    for idle_reader, _ in held:  # idle connections go after the header timeout
        await closed_within(idle_reader, 8)
    assert time.monotonic() - start < 6
    for _, w in held:
        w.close()
    status, _ = await call(r.url, {"prompt": "hi"})  # room again
    assert status == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "Basic s3cret-key"}, 401),
        ({"Authorization": "Bearer s3cret-key"}, 200),
        ({"Authorization": "bearer  s3cret-key "}, 200),
    ],
)
async def test_api_key(headers: dict[str, str], status: int, stubs: Start, router: Start) -> None:
    r, worker = await one_worker(stubs, router, api_key="s3cret-key")
    got, raw = await call(r.url, {"prompt": "hi"}, headers=headers)
    assert got == status
    if status == 401:
        assert orjson.loads(raw)["error"]["type"] == "authentication_error"
        assert worker.calls == 0
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.get(r.url + "/v1/models") as resp:
            assert resp.status == status
        for open_path in ("/health", "/metrics"):
            async with s.get(r.url + open_path) as resp:
                assert resp.status == 200


def test_api_key_sources(tmp_path: Any) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert load_api_keys(str(key_file), {"XPYD_ROUTER_API_KEY": "from-env"}) == ("from-file",)
    assert load_api_keys(None, {"XPYD_ROUTER_API_KEY": " from-env "}) == ("from-env",)
    assert load_api_keys(None, {}) == ()
    key_file.write_text("new-key\n\n  old-key \nnew-key\n")  # one a line: both accepted while clients move
    assert load_api_keys(str(key_file), {}) == ("new-key", "old-key")
    assert ApiKey(None).allows(None)
    assert not ApiKey("k").allows("Bearer \udcff")


@pytest.mark.parametrize(
    ("content", "env", "message"),
    [
        (None, {}, "cannot read --api-key-file"),
        ("", {}, "is empty"),
        ("two words", {}, "one printable token"),
        ("skip", {"XPYD_ROUTER_API_KEY": ""}, "$XPYD_ROUTER_API_KEY is empty"),
    ],
)
def test_bad_api_keys_are_named(content: str | None, env: dict[str, str], message: str, tmp_path: Any) -> None:
    path = tmp_path / "key"
    if content not in (None, "skip"):
        path.write_text(content)
    with pytest.raises(ValueError, match=message.replace("$", r"\$")):
        load_api_keys(None if content == "skip" else str(path), env)


@pytest.mark.parametrize("mentions_address", [False, True])
async def test_a_workers_4xx_passes_through_unless_it_names_an_address(
    mentions_address: bool, stubs: Start, router: Start
) -> None:
    r, worker = await one_worker(stubs, router)
    where = worker.url.split("//")[1].rsplit(":", 1)[0] if mentions_address else "here"
    worker.reject = f"max_tokens too large (seen at {where})"
    status, raw = await call(r.url, {"prompt": "hi"})
    assert status == 400
    message = orjson.loads(raw)["error"]["message"]
    assert ("127.0.0.1" in message) is False
    assert ("max_tokens too large" in message) is not mentions_address
    assert r.pool.workers[worker.url].healthy


async def test_malformed_requests_log_one_line_each(
    stubs: Start, router: Start, caplog: pytest.LogCaptureFixture
) -> None:
    r, _ = await one_worker(stubs, router)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    caplog.set_level(logging.WARNING, logger="xpyd_router")
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(r))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: nope\r\n\r\n")
    data = await closed_within(reader, 5)
    writer.close()
    assert data.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
    status, _ = await call(r.url, b"{not json")
    assert status == 400
    warnings = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(warnings) == 2, [rec.getMessage() for rec in warnings]
    assert all(rec.exc_info is None and "\n" not in rec.getMessage() for rec in warnings)
