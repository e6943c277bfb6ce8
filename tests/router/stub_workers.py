"""Small in-process worker stubs on 127.0.0.1 for the router's failure tests: each misbehaves on cue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

SECRET_ENGINE = "engine-7f3a-secret"
SIDE_CHANNEL = "127.0.0.77"  # an address that must never reach a client
# Modes: ok, error500, poison (500 only when the prompt says POISON), garbage (200 with a non-JSON
# body or SSE event), hang (never answers), stall (a stream that stops after two events), nokv (a
# prefill reply without kv_transfer_params), leak (replies carrying kv_transfer_params).
MODES = ("ok", "error500", "poison", "garbage", "hang", "stall", "nokv", "leak", "first_stall")


def _completion(text: str, chat: bool, leak: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    doc: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}
    doc["usage"] = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if leak:
        doc["kv_transfer_params"] = {"remote_engine_id": SECRET_ENGINE, "remote_host": SIDE_CHANNEL}
    return doc


@dataclass
class Stub:
    """One stub worker; `mode` may change while it runs."""

    url: str
    role: str
    domain: str = ""
    mode: str = "ok"
    health: int = 200
    reject: str = ""  # a 400 with this message
    bodies: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def calls(self) -> int:
        return len(self.bodies)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = request.path.endswith("/chat/completions")
        prompt = orjson.dumps(body.get("prompt") or body.get("messages")).decode()
        mode = self.mode
        if self.reject:
            return web.json_response({"error": {"message": self.reject, "type": "BadRequestError"}}, status=400)
        if mode == "poison" and "POISON" in prompt:
            mode = "error500"
        if mode == "error500":
            return web.json_response({"error": {"message": f"engine at {SIDE_CHANNEL} failed"}}, status=500)
        if mode == "hang":
            await self.release.wait()
        kv = body.get("kv_transfer_params")
        if mode == "kvfail" and isinstance(kv, dict) and kv.get("do_remote_prefill"):  # the KV to read is gone
            error = {"message": "KV load failed", "type": "InternalServerError"}
            return web.json_response({"error": error}, status=500)
        if isinstance(kv, dict) and kv.get("do_remote_decode"):  # a prefill hop
            params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": SECRET_ENGINE,
                      "remote_block_ids": [1, 2], "remote_host": SIDE_CHANNEL, "remote_port": 5600}  # fmt: skip
            doc = _completion("x", chat, leak=False)
            if mode != "nokv":
                doc["kv_transfer_params"] = params
            return web.json_response(doc)
        if body.get("stream") is True:
            return await self._stream(request, chat, mode)
        if mode == "garbage":
            return web.Response(body=b"<html>502 from a proxy</html>", content_type="application/json")
        return web.json_response(_completion("hello", chat, leak=mode == "leak"))

    async def _stream(self, request: web.Request, chat: bool, mode: str) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        if mode == "first_stall":
            await self.release.wait()
        for i in range(4):
            if mode == "garbage" and i == 0:
                await out.write(b"data: {this is not json\n\n")
                continue
            delta: dict[str, Any] = {"index": 0}
            if chat:
                delta["delta"] = {"content": f"t{i}"}
            else:
                delta["text"] = f"t{i}"
            event: dict[str, Any] = {"id": "c", "choices": [delta]}
            if mode == "leak" and i == 3:
                event["kv_transfer_params"] = {"remote_engine_id": SECRET_ENGINE, "remote_host": SIDE_CHANNEL}
            await out.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if mode == "stall" and i == 1:
                await self.release.wait()
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def health_check(self, _: web.Request) -> web.Response:
        if self.health != 200 and self.mode == "hang":
            await self.release.wait()
        return web.Response(status=self.health)

    async def metrics(self, _: web.Request) -> web.Response:
        if self.health != 200:
            return web.Response(status=503)
        return web.Response(text="vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")

    async def models(self, _: web.Request) -> web.Response:
        if self.mode == "hang":
            await self.release.wait()
        return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})


async def silent_server() -> tuple[str, asyncio.Server]:
    """Accepts connections and never says a word (not even to /health)."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server


StubFactory = Callable[..., "asyncio.Future[Stub]"]


@pytest.fixture
async def stubs() -> AsyncIterator[Callable[..., Any]]:
    runners: list[tuple[web.AppRunner, Stub]] = []

    async def start(role: str = "decode", mode: str = "ok", domain: str = "") -> Stub:
        stub = Stub("", role, domain, mode)
        app = web.Application()
        app.router.add_post("/v1/completions", stub.completion)
        app.router.add_post("/v1/chat/completions", stub.completion)
        app.router.add_get("/health", stub.health_check)
        app.router.add_get("/metrics", stub.metrics)
        app.router.add_get("/v1/models", stub.models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        stub.url = f"http://127.0.0.1:{site.port}"
        runners.append((runner, stub))
        return stub

    yield start
    for runner, stub in runners:
        stub.release.set()
        await runner.cleanup()


async def call(
    url: str,
    body: dict[str, Any] | bytes,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
    limit: float = 10.0,
) -> tuple[int, bytes]:
    """One request to the router: status and raw body."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit)) as s,
        s.post(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as resp,
    ):
        return resp.status, await resp.read()


def events(raw: bytes) -> list[Any]:
    """The data payloads of an SSE body, JSON-decoded except [DONE]."""
    out: list[Any] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            out.append(payload.decode() if payload == b"[DONE]" else orjson.loads(payload))
    return out
