"""The aiohttp app: vLLM's OpenAI routes, /health and /metrics, and a graceful SIGTERM shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web

from xpyd_emulator.bootstrap import bootstrap_app
from xpyd_emulator.cmdline import EmulatorConfig
from xpyd_emulator.engine import Sequence
from xpyd_emulator.kvtransfer import side_channel_app
from xpyd_emulator.protocol import (
    DONE,
    ApiError,
    ParsedRequest,
    SseFormat,
    full_response,
    parse_request,
    usage,
)
from xpyd_emulator.tokens import filler
from xpyd_emulator.worker import Worker

log = logging.getLogger("xpyd.emulator")
WORKER: web.AppKey[Worker] = web.AppKey("worker", Worker)
_JSON = "application/json"
SGLANG_BOOTSTRAP_PORT = 8998
# Tokens of steps shorter than this (high --speedup) are coalesced into one write, as vLLM's
# --stream-interval does; a stream's first token is always written at once.
FLUSH_SECONDS = 0.001


def _error(exc: ApiError) -> web.Response:
    return web.Response(status=exc.status, body=exc.body(), content_type=_JSON)


async def _wait(seq: Sequence) -> None:
    while not seq.done:
        await seq.event.wait()
        seq.event.clear()


async def _stream(request: web.Request, req: ParsedRequest, seq: Sequence) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    fmt = SseFormat(req)
    out = [fmt.role()] if req.chat else []
    sent = 0
    last = seq.max_tokens - 1
    finish = req.finish_reason
    loop = asyncio.get_running_loop()
    flushed = -FLUSH_SECONDS
    while True:
        if not seq.done:
            await seq.event.wait()
            seq.event.clear()
        upto = seq.generated
        for i in range(sent, upto):
            out.append(fmt.last(filler(i, 1), finish) if i == last else fmt.token(filler(i, 1)))
        sent = upto
        if seq.done:
            break
        if out and loop.time() - flushed >= FLUSH_SECONDS:
            await resp.write(b"".join(out))
            out = []
            flushed = loop.time()
    if req.include_usage:
        out.append(fmt.usage(usage(seq.prompt, seq.generated, seq.cached)))
    out.append(DONE)
    request.app[WORKER].metrics.success[req.finish_reason] += 1
    await resp.write(b"".join(out))
    await resp.write_eof()
    return resp


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    worker = request.app[WORKER]
    cfg = worker.cfg
    seq: Sequence | None = None
    worker.inflight += 1
    try:
        req = parse_request(
            await request.read(), chat=chat, served=cfg.served_model_names,
            max_model_len=worker.max_model_len, block_size=cfg.block_size,
            hash_blocks=cfg.enable_prefix_caching,
            default_output_tokens=cfg.default_output_tokens,
        )  # fmt: skip
        seq = await worker.admit(req)
        if req.stream:
            return await _stream(request, req, seq)
        await _wait(seq)
        use = usage(seq.prompt, seq.generated, seq.cached)
        body = full_response(req, filler(0, seq.generated), req.finish_reason, use, worker.kv_params(req, seq))
        worker.metrics.success[req.finish_reason] += 1
        return web.Response(body=body, content_type=_JSON)
    except ApiError as exc:
        return _error(exc)
    except (asyncio.CancelledError, ConnectionResetError):
        if seq is not None:
            worker.engine.abort(seq)
        raise
    finally:
        worker.inflight -= 1


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    data: list[dict[str, object]] = [
        {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
         "root": worker.cfg.model, "parent": None, "max_model_len": worker.max_model_len, "permission": []}
        for name in worker.cfg.served_model_names
    ]  # fmt: skip
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.11.0+xpyd.emulator"})


async def metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    worker.metrics.kv_usage = worker.pool.usage
    worker.metrics.index_blocks = len(worker.pool)
    return web.Response(text=worker.metrics.render(), content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})  # fmt: skip


async def reset_prefix_cache(request: web.Request) -> web.Response:
    request.app[WORKER].pool.reset()
    return web.Response(status=200)


async def not_found(request: web.Request) -> web.Response:
    return _error(ApiError(f"no route {request.method} {request.path}", status=404))


def build_app(worker: Worker) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[WORKER] = worker
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


async def serve(cfg: EmulatorConfig, stop: asyncio.Event | None = None, drain_seconds: float = 30.0) -> None:
    """Serve until SIGTERM/SIGINT (or `stop` is set); then stop accepting, finish in-flight, exit."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    worker = Worker(cfg)
    await worker.start()
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the request in the
    # engine (as vLLM aborts on disconnect); without it abandoned requests would keep the GPU busy.
    runners = [web.AppRunner(build_app(worker), access_log=None, handler_cancellation=True)]
    addresses = [(cfg.host, cfg.port)]
    if worker.connector:
        runners.append(web.AppRunner(side_channel_app(worker.leases), access_log=None))
        addresses.append((cfg.side_channel_host, cfg.side_channel_port))
    if worker.bootstrap_server:
        runners.append(web.AppRunner(bootstrap_app(worker.rooms), access_log=None))
        addresses.append((cfg.host, cfg.bootstrap_port or SGLANG_BOOTSTRAP_PORT))
    sites: list[web.TCPSite] = []
    try:
        for runner, (host, port) in zip(runners, addresses, strict=True):
            await runner.setup()
            sites.append(web.TCPSite(runner, host, port, backlog=2048, reuse_address=True))
            await sites[-1].start()
        log.info("emulating %s (%s x%d, %d KV blocks) on %s:%d", cfg.model, worker.gpu.name, cfg.tp,
                 worker.pool.num_blocks, cfg.host, cfg.port)  # fmt: skip
        await stop.wait()
        await sites[0].stop()  # stop accepting; in-flight requests (and KV pulls) go on
        deadline = loop.time() + drain_seconds
        while worker.inflight > 0 and loop.time() < deadline:  # noqa: ASYNC110 - a count, not an event
            await asyncio.sleep(0.02)
    finally:
        for runner in runners:
            await runner.cleanup()
        await worker.stop()
