"""The request path: authorize, read and check the body, route, retry across workers, within a deadline."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import aiohttp

from xpyd_api import labels
from xpyd_http.messages import Answer, BodyError, Reply, Request, error_reply
from xpyd_router import handoff
from xpyd_router.handoff import HopFailed
from xpyd_router.hashing import affinity_key
from xpyd_router.hold import ColdHold, HoldRefused
from xpyd_router.hops import Exchange, Hops
from xpyd_router.http.access import TIMEOUT_HEADER, ApiKey, request_budget
from xpyd_router.http.protocol import BadRequest, JsonObj, parse_body, sse_error
from xpyd_router.http.upstream import Upstream
from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import NoWorker, Plan, RouteRequest
from xpyd_router.pairs import PairLimits, Pairs
from xpyd_router.pool import WorkerPool

log = logging.getLogger("xpyd_router")
# A prompt this long (characters) is tokenized on a thread, not on the event loop: with a real model's
# tokenizer (about 0.3 us a character) it would hold every other request's bytes for 5 ms or more,
# and `tokenizers` releases the GIL, so the threads also use the other cores. Shorter ones stay on
# the loop, where a thread's hand-off (tens of microseconds) would cost more than it saves.
OFFLOAD_CHARS = 16 << 10


@dataclass
class ProxyConfig:
    engine: str = "vllm"  # an xpyd_api.engines kind: picks the KV handoff protocol
    max_attempts: int = 3  # tries per request over distinct workers
    bootstrap_port: int = labels.SGLANG_BOOTSTRAP_PORT  # SGLang prefill bootstrap server port
    connect_timeout: float = 5.0  # to open a connection to a worker
    first_byte_timeout: float = 120.0  # prefill budget: request sent to first body byte (streams, prefill hop)
    idle_timeout: float = 30.0  # longest silence between a worker's body reads
    request_timeout: float = 600.0  # whole request; a client may lower it with X-Request-Timeout
    body_timeout: float = 30.0  # for the client to send its request body
    api_key: str | Sequence[str] | None = None  # Authorization: Bearer <key> on the OpenAI routes (any of them)
    api_key_file: str | None = None  # where the keys came from: re-read when it changes (rotation)
    tokenizer_threads: int = 2  # threads that tokenize long prompts (0: all on the event loop)
    kv_bytes_per_token: int = 0  # the model's KV bytes per prompt token: the handoff bytes series (0: none)
    pairs: PairLimits = field(default_factory=PairLimits)  # when a prefill/decode pair cools off
    warm_pairs: bool = False  # a warm-up handoff per new pair (the CLI's default is on: --no-warm-pairs)
    hold_seconds: float = 0.0  # a request no worker can take waits this long for one (0: 503 at once)
    hold_max: int = 256  # requests waiting so at once; the next gets 503 at once
    served_model: str | None = None  # what /v1/models lists while no worker can (a pool at zero)


class Proxy:
    def __init__(self, pool: WorkerPool, metrics: RouterMetrics, config: ProxyConfig) -> None:
        self.pool = pool
        self.metrics = metrics
        self.config = config
        self.session: aiohttp.ClientSession | None = None  # for probes, /metrics scrapes and /v1/models
        self.upstream = Upstream(config.connect_timeout, config.first_byte_timeout, config.idle_timeout)
        kv = handoff.for_engine(config.engine, config.bootstrap_port)
        self.hops = Hops(pool, metrics, self.upstream, kv, Pairs(pool, metrics, config.pairs))
        metrics.kv_bytes_per_token = config.kv_bytes_per_token
        self.api_key = ApiKey(config.api_key, config.api_key_file)
        self.inflight = 0  # requests being served; the gauge reads it when scraped (no lock per request)
        metrics.inflight_now.set_function(lambda: self.inflight)
        self._keyer: ThreadPoolExecutor | None = None  # started by the first long prompt
        self.hold = ColdHold(config.hold_seconds, config.hold_max)  # requests waiting for a worker to start
        if self.hold.enabled:
            self.hold.on_served = metrics.hold(self.hold)

    def close(self) -> None:
        self.upstream.close()
        if self._keyer is not None:
            self._keyer.shutdown(wait=False, cancel_futures=True)

    async def _keys(self, body: JsonObj, text: str, chat: bool) -> list[int]:
        """The request's block keys; a long prompt's tokenized on a thread (OFFLOAD_CHARS)."""
        keys = self.pool.keys
        if keys.tokenizer is None or len(text) < OFFLOAD_CHARS or self.config.tokenizer_threads <= 0:
            return keys.for_request(body, text, chat)
        if self._keyer is None:
            self._keyer = ThreadPoolExecutor(self.config.tokenizer_threads, thread_name_prefix="xpyd-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._keyer, keys.for_request, body, text, chat)

    async def completions(self, request: Request) -> Answer:
        return await self._serve(request, "/v1/completions", chat=False)

    async def chat(self, request: Request) -> Answer:
        return await self._serve(request, "/v1/chat/completions", chat=True)

    def unauthorized(self, request: Request) -> Reply | None:
        """A 401 when an API key is set and the request does not carry it."""
        if not self.api_key.required or self.api_key.allows(request.header("Authorization")):
            return None
        self.metrics.error("unauthorized")
        log.warning("rejected %s %s from %s: missing or wrong API key", request.method, request.path, request.remote)
        message = "missing or wrong API key; send 'Authorization: Bearer <key>'"
        resp = error_reply(401, message, "authentication_error")
        resp.headers = (("WWW-Authenticate", "Bearer"),)
        return resp

    async def _serve(self, request: Request, path: str, chat: bool) -> Answer:
        self.inflight += 1
        try:
            response = await self._handle(request, path, chat)
        except asyncio.CancelledError:  # the client left; the server cancelled the handler
            self.metrics.error("client_disconnected")
            raise
        except Exception:  # a bug, not the client's or a worker's doing: say so once, keep serving
            log.exception("internal error on %s", path)
            self.metrics.error("internal")
            response = error_reply(500, "internal router error", "internal_error")
        finally:
            self.inflight -= 1
        self.metrics.request(path, response.status)
        return response

    def _bad_request(self, request: Request, status: int, message: str, param: str | None) -> Reply:
        log.warning("bad request from %s to %s: %s", request.remote, request.path, message)
        self.metrics.error("bad_request" if status == 400 else f"http_{status}")
        resp = error_reply(status, message, "invalid_request_error", param)
        resp.close = status != 400  # the body was not (all) read: do not wait for the rest of it
        return resp

    async def _read(self, request: Request) -> bytes:
        if request.complete:  # the usual case: the body came with the headers
            return await request.read()
        async with asyncio.timeout(self.config.body_timeout):
            return await request.read()

    async def _handle(self, request: Request, path: str, chat: bool) -> Answer:
        denied = self.unauthorized(request)
        if denied is not None:
            return denied
        try:
            budget = request_budget(request.header(TIMEOUT_HEADER), self.config.request_timeout)
            raw = await self._read(request)
            body, text = parse_body(raw, chat)
        except BadRequest as exc:
            return self._bad_request(request, 400, str(exc), exc.param)
        except BodyError as exc:  # too large (413) or malformed (400)
            return self._bad_request(request, exc.status, str(exc), None)
        except TimeoutError:
            message = f"request body not received within {self.config.body_timeout:g}s"
            return self._bad_request(request, 408, message, None)
        blocks = await self._keys(body, text, chat)
        req = RouteRequest(blocks, affinity_key(blocks, text), len(text))
        ex = Exchange(request)
        try:
            async with asyncio.timeout(budget):
                return await self._dispatch(ex, path, body, req)
        except TimeoutError:
            self.metrics.error("deadline")
            message = f"request did not finish within its {budget:g}s deadline"
            log.warning("%s %s: %s", request.remote, path, message)
            if ex.out is None:  # no stream opened yet: the status is not committed
                return error_reply(504, message, "timeout_error")
            await ex.end_stream(sse_error(message, "timeout_error", 504))
            return ex.out

    async def _dispatch(self, ex: Exchange, path: str, body: JsonObj, req: RouteRequest) -> Answer:
        stream = body.get("stream") is True
        tried: set[str] = set()
        last_error = ""
        for attempt in range(self.config.max_attempts):
            try:
                plan = self.pool.route(req, frozenset(tried))
            except NoWorker as exc:
                if last_error:  # every worker there is failed this request
                    break
                if not self.hold.enabled:
                    self.metrics.error("no_worker")
                    return error_reply(503, str(exc), "service_unavailable")
                try:  # a pool at zero or starting: wait for a worker (the waiting count wakes the pools)
                    plan = await self.hold.wait(lambda: self.pool.route(req, frozenset(tried)))
                except HoldRefused as refused:
                    self.metrics.error("no_worker")
                    reply = error_reply(503, str(refused), "service_unavailable")
                    return replace(reply, headers=(("Retry-After", str(refused.retry_after)),))
            plan = self.hops.settle(ex, plan)
            self._count(plan, req, retry=attempt > 0)
            try:
                return await self.hops.run(ex, path, body, req, plan, stream)
            except HopFailed as exc:
                last_error = str(exc)
                if self.hops.pair_failed(ex, exc):
                    log.warning("KV handoff failed: %s; retried on another pair or decode-only", exc.detail)
                    continue
                tried.add(exc.worker)
                self.hops.blame(exc.worker, exc.worker_down, exc.detail)
        return error_reply(502, f"every attempt failed; last: {last_error}", "upstream_error")

    def _count(self, plan: Plan, req: RouteRequest, retry: bool) -> None:
        m = self.metrics
        if retry:
            m.retries.labels(m.deployment, "prefill" if plan.prefill else "decode").inc()
        if plan.prefill is not None:
            m.decision("prefill", plan.prefill.reason)
            m.handoff(plan.kv_path)
        m.decision("decode", plan.decode.reason)
        first = plan.prefill or plan.decode
        offloaded = self.pool.index.offloaded.run(first.worker, req.blocks, first.matched_blocks)
        m.prompt(len(req.blocks), first.matched_blocks, offloaded)
