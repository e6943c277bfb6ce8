"""vLLM's OpenAI routes, /health and /metrics on the listener (listener.py), and the process's life: serve, then drain.

On SIGTERM (or `stop`) /health turns 503 at once, so the router and the kubelet stop sending;
new requests get 503, except decode hops whose KV a prefill already holds for this worker.
Running requests finish, a prefill keeps its leased KV (and SGLang rooms) until the decodes have
pulled them or the leases expire, a decode finishes every pull already under way, then the
process exits: after `--drain-timeout` seconds at most (default 25, under Kubernetes' 30 s
terminationGracePeriodSeconds), or at once on a second signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable

import orjson

from xpyd_emulator.bootstrap import bootstrap_server
from xpyd_emulator.cmdline import EmulatorConfig
from xpyd_emulator.dp_routing import header_rank
from xpyd_emulator.engine import Sequence
from xpyd_emulator.errors import ApiError
from xpyd_emulator.kvtransfer import side_channel_server
from xpyd_emulator.listener import BACKLOG, Handler, json_error, make_server, read_body
from xpyd_emulator.peers import SGLANG_BOOTSTRAP_PORT
from xpyd_emulator.protocol import DONE, ParsedRequest, SseFormat, full_response, parse_request, usage
from xpyd_emulator.tokens import filler
from xpyd_emulator.worker import Worker
from xpyd_http.messages import Answer, Reply, Request, Stream
from xpyd_http.server import Server

log = logging.getLogger("xpyd.emulator")
# Tokens of steps shorter than this (high --speedup) are coalesced into one write, as vLLM's
# --stream-interval does; a stream's first token is always written at once.
FLUSH_SECONDS = 0.001
ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/health": "GET",
          "/ping": "GET", "/version": "GET", "/metrics": "GET", "/reset_prefix_cache": "POST"}  # fmt: skip
ENGINE_STOPPED = "the engine stopped before this request finished; see the worker's log."


async def _wait(seq: Sequence) -> None:
    while not seq.done:
        await seq.event.wait()
        seq.event.clear()


async def _stream(worker: Worker, request: Request, req: ParsedRequest, seq: Sequence) -> Stream:
    resp = request.stream({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.start()
    try:
        await _relay(worker, resp, req, seq)
    except ConnectionError as exc:  # the client went away: its connection is gone
        log.debug("client of a stream went away: %s", exc)
    except Exception:  # the answer is under way: no error reply now, the unfinished stream closes the connection
        log.exception("500 in the stream of %s %s", request.method, request.path)
    return resp


async def _relay(worker: Worker, resp: Stream, req: ParsedRequest, seq: Sequence) -> None:
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
    if seq.aborted:  # the engine failed under us: vLLM's SSE error event, then [DONE]
        out.append(b"data: " + ApiError(ENGINE_STOPPED, 500).body() + b"\n\n" + DONE)
        await resp.write(b"".join(out))
        await resp.write_eof()
        return
    if req.include_usage:
        out.append(fmt.usage(usage(seq.prompt, seq.generated, seq.cached)))
    out.append(DONE)
    worker.rank_metrics[seq.rank].success[req.finish_reason] += 1
    await resp.write(b"".join(out))
    await resp.write_eof()


async def _generate(worker: Worker, request: Request, chat: bool) -> Answer:
    cfg = worker.cfg
    seq: Sequence | None = None
    delivered = False
    worker.inflight += 1
    try:
        req = parse_request(
            await read_body(request, worker.limits), chat=chat, served=cfg.served_model_names,
            max_model_len=worker.max_model_len, block_size=cfg.block_size,
            hash_blocks=cfg.enable_prefix_caching, default_output_tokens=cfg.default_output_tokens,
            sglang=worker.sglang,
        )  # fmt: skip
        req.data_parallel_rank = header_rank(request.headers)
        seq = await worker.admit(req)
        if req.stream:
            stream = await _stream(worker, request, req, seq)
            delivered = stream.finished
            return stream
        await _wait(seq)
        if seq.aborted:
            raise ApiError(ENGINE_STOPPED, 500)
        use = usage(seq.prompt, seq.generated, seq.cached)
        body = full_response(req, filler(0, seq.generated), req.finish_reason, use, worker.kv_params(seq))
        worker.rank_metrics[seq.rank].success[req.finish_reason] += 1
        delivered = True
        return Reply(200, body)
    finally:
        worker.inflight -= 1
        worker.finish(seq, delivered)


async def completions(worker: Worker, request: Request) -> Answer:
    return await _generate(worker, request, chat=False)


async def chat_completions(worker: Worker, request: Request) -> Answer:
    return await _generate(worker, request, chat=True)


async def models(worker: Worker, request: Request) -> Reply:
    data: list[dict[str, object]] = [
        {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
         "root": worker.cfg.model, "parent": None, "max_model_len": worker.max_model_len, "permission": []}
        for name in worker.cfg.served_model_names
    ]  # fmt: skip
    return Reply(200, orjson.dumps({"object": "list", "data": data}))


def empty() -> Reply:
    """200 with no body (vLLM's /health, /reset_prefix_cache)."""
    return Reply(200, b"", "application/octet-stream")


async def health(worker: Worker, request: Request) -> Reply:
    """200 when the engine takes traffic; 503 once draining (SIGTERM) or when the engine is wedged."""
    problem = worker.problem()
    return json_error(ApiError(problem, 503)) if problem else empty()


async def version(worker: Worker, request: Request) -> Reply:
    return Reply(200, orjson.dumps({"version": "0.11.0+xpyd.emulator"}))


async def metrics(worker: Worker, request: Request) -> Reply:
    if not worker.cfg.metrics:  # SGLang without --enable-metrics has no such route
        raise ApiError(f"no route {request.method} {request.path[:100]}", status=404)
    return Reply(200, worker.render_metrics().encode(), "text/plain; charset=utf-8",
                 (("X-Prometheus-Format", "0.0.4"),))  # fmt: skip


async def reset_prefix_cache(worker: Worker, request: Request) -> Reply:
    worker.pool.reset()
    worker.engine.flush_events()  # AllBlocksCleared, as vLLM reports a reset
    return empty()


async def not_found(request: Request) -> Reply:
    method = ROUTES.get(request.path)
    if method is not None:
        raise ApiError(f"{request.method} is not allowed on {request.path[:100]}; use {method}.", status=405)
    raise ApiError(f"no route {request.method} {request.path[:100]}", status=404)


WorkerHandler = Callable[[Worker, Request], Awaitable[Answer]]
HANDLERS: dict[str, WorkerHandler] = {
    "/v1/completions": completions, "/v1/chat/completions": chat_completions, "/v1/models": models,
    "/health": health, "/ping": health, "/version": version, "/metrics": metrics,
    "/reset_prefix_cache": reset_prefix_cache,
}  # fmt: skip


def _bound(handler: WorkerHandler, worker: Worker) -> Handler:
    async def serve(request: Request) -> Answer:
        return await handler(worker, request)

    return serve


def build_server(worker: Worker) -> Server:
    """The API port's listener: the routes above, within the worker's limits."""
    routes = {(ROUTES[path], path): _bound(handler, worker) for path, handler in HANDLERS.items()}
    return make_server(routes, worker.limits, fallback=not_found)


SHUTDOWN_SECONDS = 2.0  # after the drain: how long the listeners wait for handlers still running


async def _drain(worker: Worker, seconds: float, force: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    worker.draining = True
    deadline = loop.time() + seconds
    log.info("draining: %d requests in flight, %d KV leases and %d rooms not yet pulled; exiting within %g s",
             worker.inflight, len(worker.leases), worker.rooms.published(), seconds)  # fmt: skip
    while worker.busy() and loop.time() < deadline and not force.is_set():  # noqa: ASYNC110 - counts, not events
        await asyncio.sleep(0.02)
    if worker.busy():
        log.warning("drain cut short: %d requests, %d KV leases and %d rooms left", worker.inflight,
                    len(worker.leases), worker.rooms.published())  # fmt: skip


async def serve(
    cfg: EmulatorConfig,
    stop: asyncio.Event | None = None,
    drain_seconds: float | None = None,
    *,
    worker: Worker | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop` is set), then drain (see the module doc) and return."""
    stop = stop or asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
    worker = worker or Worker(cfg)
    await worker.start()
    sites = [(build_server(worker), cfg.host, cfg.port)]
    if worker.connector:
        side = side_channel_server(worker.leases, worker.peers, worker.limits, worker.handshake())
        sites.append((side, cfg.side_channel_host, cfg.side_channel_port))
    if worker.bootstrap_server:
        sites.append((bootstrap_server(worker.rooms, worker.peers, worker.limits), cfg.host,
                      cfg.bootstrap_port or SGLANG_BOOTSTRAP_PORT))  # fmt: skip
    listening: list[Server] = []
    try:
        for server, host, port in sites:
            listening.append(server)
            await server.listen(host, port, backlog=BACKLOG)
        gpus = cfg.layout.world if worker.wide else cfg.tp
        log.info("emulating %s (%s x%d, %d KV blocks) on %s:%d; KV peers %s", cfg.model, worker.gpu.name, gpus,
                 worker.pool.num_blocks, cfg.host, cfg.port, worker.peers.describe())  # fmt: skip
        await stop.wait()
        await _drain(worker, cfg.drain_seconds if drain_seconds is None else drain_seconds, force)
    finally:
        for server in reversed(listening):
            await server.close(SHUTDOWN_SECONDS)
        await worker.stop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
