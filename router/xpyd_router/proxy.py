"""The request path: parse, route, run the prefill and decode hops, stream the answer back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal

import aiohttp
import orjson
from aiohttp import web

from xpyd_router.hashing import affinity_key, block_hashes
from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import NoWorker, Plan, RouteRequest
from xpyd_router.pool import WorkerPool
from xpyd_router.protocol import (
    BadRequest,
    JsonObj,
    bootstrap_bodies,
    decode_body,
    error_body,
    parse_body,
    prefill_body,
    sse_error,
)
from xpyd_router.upstream import Upstream, UpstreamError, UpstreamResponse

JSON = "application/json"


class HopFailed(Exception):
    """A worker failed before the client saw any of its answer: the hop may go to another worker."""

    def __init__(self, message: str, worker: str) -> None:
        super().__init__(message)
        self.worker = worker


@dataclass
class ProxyConfig:
    engine: Literal["vllm", "sglang"] = "vllm"
    max_attempts: int = 3  # tries per request over distinct workers
    bootstrap_port: int = 8998  # SGLang prefill bootstrap server port
    upstream_timeout: float = 600.0  # longest silence from a worker before the hop fails


def error_response(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(message, kind, status, param), content_type=JSON)


class Proxy:
    def __init__(self, pool: WorkerPool, metrics: RouterMetrics, config: ProxyConfig) -> None:
        self.pool = pool
        self.metrics = metrics
        self.config = config
        self.session: aiohttp.ClientSession | None = None  # for /metrics scrapes and /v1/models
        self.upstream = Upstream(read_timeout=config.upstream_timeout)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "/v1/completions", chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "/v1/chat/completions", chat=True)

    async def _serve(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        self.metrics.inflight_now.inc()
        try:
            response = await self._handle(request, path, chat)
        finally:
            self.metrics.inflight_now.dec()
        self.metrics.request(path, response.status)
        return response

    async def _handle(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            self.metrics.error("body_too_large")
            return error_response(413, f"request body too large: {exc.text}", "invalid_request_error")
        try:
            body, text = parse_body(raw, chat)
        except BadRequest as exc:
            self.metrics.error("bad_request")
            return error_response(400, str(exc), "invalid_request_error", exc.param)
        blocks = block_hashes(text, self.pool.block_chars)
        req = RouteRequest(blocks, affinity_key(blocks, text), len(text))
        return await self._dispatch(request, path, body, req)

    async def _dispatch(self, request: web.Request, path: str, body: JsonObj, req: RouteRequest) -> web.StreamResponse:
        stream = body.get("stream") is True
        tried: set[str] = set()
        last_error = ""
        for attempt in range(self.config.max_attempts):
            try:
                plan = self.pool.route(req, frozenset(tried))
            except NoWorker as exc:
                self.metrics.error("no_worker")
                detail = f"{exc}; failed: {last_error}" if last_error else str(exc)
                return error_response(503, detail, "service_unavailable")
            self._count(plan, req, retry=attempt > 0)
            try:
                return await self._run(request, path, body, req, plan, stream)
            except HopFailed as exc:
                last_error = str(exc)
                tried.add(exc.worker)
                self.pool.mark_failed(exc.worker)
                self.metrics.error("worker_failed")
        return error_response(502, f"every attempt failed; last: {last_error}", "upstream_error")

    def _count(self, plan: Plan, req: RouteRequest, retry: bool) -> None:
        m = self.metrics
        if retry:
            m.retries.labels(m.deployment, "prefill" if plan.prefill else "decode").inc()
        if plan.prefill is not None:
            m.decision("prefill", plan.prefill.reason)
            m.handoff(plan.kv_path)
        m.decision("decode", plan.decode.reason)
        first = plan.prefill or plan.decode
        m.prompt(len(req.blocks), first.matched_blocks)

    async def _run(
        self, request: web.Request, path: str, body: JsonObj, req: RouteRequest, plan: Plan, stream: bool
    ) -> web.StreamResponse:
        if plan.prefill is None:
            return await self._decode(request, plan.decode.worker, path, orjson.dumps(body), stream, "direct")
        prefill_url = plan.prefill.worker
        uncached = len(req.blocks) - plan.prefill.matched_blocks
        if self.config.engine == "sglang":
            first, second = bootstrap_bodies(body, prefill_url, self.config.bootstrap_port)
            task = asyncio.create_task(self._prefill(prefill_url, path, first, uncached))
            try:
                return await self._decode(request, plan.decode.worker, path, second, stream, "decode")
            finally:
                if not task.done():
                    task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        answer = await self._prefill(prefill_url, path, prefill_body(body), uncached)
        if isinstance(answer, web.Response):
            return answer
        payload = decode_body(body, answer.get("kv_transfer_params"))
        return await self._decode(request, plan.decode.worker, path, payload, stream, "decode")

    async def _prefill(self, worker: str, path: str, payload: bytes, blocks: int) -> JsonObj | web.Response:
        start = time.perf_counter()
        self.pool.begin(worker, blocks)
        try:
            resp = await self.upstream.post(worker, path, payload)
            try:
                data = await resp.read()
            finally:
                resp.close()
        except UpstreamError as exc:
            raise HopFailed(f"prefill worker {worker}: {exc}", worker) from exc
        finally:
            self.pool.end(worker, blocks)
        self.metrics.hop("prefill", time.perf_counter() - start)
        if resp.status >= 500:
            raise HopFailed(f"prefill worker {worker} answered {resp.status}", worker)
        if resp.status >= 400:  # the client's mistake: pass the worker's explanation through
            return web.Response(status=resp.status, body=data, content_type=JSON)
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise HopFailed(f"prefill worker {worker} answered non-JSON", worker) from None
        if not isinstance(answer, dict) or not answer.get("kv_transfer_params"):
            if self.config.engine == "vllm":
                raise HopFailed(f"prefill worker {worker} returned no kv_transfer_params", worker)
            return {}
        return answer

    async def _decode(
        self, request: web.Request, worker: str, path: str, payload: bytes, stream: bool, hop: str
    ) -> web.StreamResponse:
        start = time.perf_counter()
        self.pool.begin(worker)
        try:
            try:
                resp = await self.upstream.post(worker, path, payload)
            except UpstreamError as exc:
                raise HopFailed(f"{hop} worker {worker}: {exc}", worker) from exc
            try:
                if resp.status >= 500:
                    raise HopFailed(f"{hop} worker {worker} answered {resp.status}", worker)
                if not stream or resp.status != 200:
                    try:
                        data = await resp.read()
                    except UpstreamError as exc:
                        raise HopFailed(f"{hop} worker {worker} broke off: {exc}", worker) from exc
                    self.metrics.hop(hop, time.perf_counter() - start)
                    return web.Response(status=resp.status, body=data, headers={"Content-Type": resp.content_type})
                return await self._relay(request, resp, hop, start)
            finally:
                resp.close()  # back to the pool if complete; else closing it cancels the worker's request
        finally:
            self.pool.end(worker)

    async def _relay(self, request: web.Request, resp: UpstreamResponse, hop: str, start: float) -> web.StreamResponse:
        """Passes SSE bytes through as they arrive."""
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await out.prepare(request)
        first = True
        try:
            async for chunk in resp.chunks():
                if first:
                    self.metrics.hop(f"{hop}_first_byte", time.perf_counter() - start)
                    first = False
                await out.write(chunk)
        except UpstreamError as exc:
            self.metrics.error("decode_midstream")
            await out.write(sse_error(f"decode worker failed mid-stream: {exc}"))
            await out.write_eof()
            return out
        except ConnectionResetError:  # the client left: closing the upstream cancels its request
            self.metrics.error("client_disconnected")
            return out
        except asyncio.CancelledError:  # the same, noticed by aiohttp's handler cancellation
            self.metrics.error("client_disconnected")
            raise
        self.metrics.hop(hop, time.perf_counter() - start)
        await out.write_eof()
        return out
