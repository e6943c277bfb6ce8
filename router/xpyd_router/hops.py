"""The worker hops of one request: prefill, decode or direct, the SSE relay, and who is to blame."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from xpyd_http.messages import Answer, Reply, Request, Stream, error_reply
from xpyd_router.handoff import Handoff, HopFailed
from xpyd_router.http.protocol import JsonObj, sse_error
from xpyd_router.http.replies import BadReply, SseFilter, json_reply
from xpyd_router.http.upstream import Upstream, UpstreamError
from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import Plan, RouteRequest
from xpyd_router.pairs import Pairs, prompt_tokens
from xpyd_router.policy.base import first_hop_blocks, prefill_blocks
from xpyd_router.pool import WorkerPool

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
log = logging.getLogger("xpyd_router")


def _host(base_url: str) -> bytes:
    return base_url.split("://", 1)[-1].rsplit(":", 1)[0].encode()


class Exchange:
    """One client request in flight: the stream to the client once its first event is ready."""

    __slots__ = ("failed_pair", "failed_pairs", "first_at", "out", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.out: Stream | None = None
        self.first_at = 0.0  # perf_counter() at the relayed stream's first event
        self.failed_pair: tuple[str, str] | None = None  # the pair whose handoff failed this request's last try
        self.failed_pairs: frozenset[tuple[str, str]] = frozenset()  # every pair that failed it: not tried again

    def open_stream(self) -> Stream:
        out = self.out = self.request.stream(SSE_HEADERS)
        return out

    async def end_stream(self, event: bytes) -> None:
        """Ends a started stream with an error event; a client that will not read is cut off."""
        out = self.out
        if out is None:
            return
        try:
            async with asyncio.timeout(1.0):
                await out.write(event)
                await out.write_eof()
        except (TimeoutError, ConnectionError):
            self.request.abort()


class Hops:
    def __init__(
        self,
        pool: WorkerPool,
        metrics: RouterMetrics,
        upstream: Upstream,
        handoff: Handoff,
        pairs: Pairs | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.upstream = upstream
        self.handoff = handoff  # how KV moves from prefill to decode (xpyd_router.handoff)
        self.pairs = pairs  # prefill/decode pair health (xpyd_router.pairs); None: every pair always pairs

    def pair_failed(self, ex: Exchange, failed: HopFailed) -> bool:
        """Whether `failed` is a handoff's decode leg answering an error, which the pair's health counts (the
        KV it was to read may be gone with its prefill worker): the decode worker stays a candidate for this
        request's retry, on another pair or on its own, and its breaker counts nothing."""
        pair = ex.failed_pair
        return self.pairs is not None and pair is not None and pair[1] == failed.worker and not failed.worker_down

    def blame(self, worker: str, worker_down: bool, detail: str) -> None:
        """A worker-level failure takes the worker out now; a failed request only counts towards its breaker."""
        if worker_down:
            log.warning("worker down: %s", detail)
            self.pool.mark_down(worker)
            self.metrics.error("worker_failed")
            return
        log.warning("request failed on a worker: %s", detail)
        self.metrics.error("worker_error")
        if self.pool.request_failed(worker):
            log.warning("worker %s failed %d requests in a row: out of rotation", worker, self.pool.breaker_failures)
            self.metrics.error("breaker_open")

    def settle(self, ex: Exchange, plan: Plan) -> Plan:
        """The policy's plan as it will run: a pair cooling off, or one that failed this request already,
        gives way to another decode worker or to decode alone (xpyd_router.pairs)."""
        if ex.failed_pair is not None:  # a retry after a failed handoff
            self.metrics.handoff_retried(*ex.failed_pair)
            ex.failed_pairs |= {ex.failed_pair}
            ex.failed_pair = None
        return plan if self.pairs is None else self.pairs.plan(plan, ex.failed_pairs)

    async def run(self, ex: Exchange, path: str, body: JsonObj, req: RouteRequest, plan: Plan, stream: bool) -> Answer:
        """Runs a settled plan (`settle`): one hop, or two with the KV handed over between them."""
        if plan.prefill is None:
            work = first_hop_blocks(plan, req)  # counted on the worker until its first token
            return await self._decode(ex, plan.decode.worker, path, orjson.dumps(body), stream, "direct", work)
        legs = _Legs(self, ex, path, stream, prefill_blocks(plan, req), plan.prefill.worker, plan.decode.worker)
        return await self.handoff.run(legs, body, plan.prefill.worker, plan.decode.worker)

    async def _prefill(self, worker: str, path: str, payload: bytes, blocks: int, parse: Callable[[bytes], Any]) -> Any:
        start = time.perf_counter()
        self.pool.begin(worker, blocks)
        try:
            resp = await self.upstream.post(worker, path, payload)
            try:
                data = await resp.read()
            finally:
                resp.close()
        except UpstreamError as exc:
            raise HopFailed("prefill worker failed", f"prefill {worker}: {exc}", worker, exc.worker_down) from None
        finally:
            self.pool.end(worker, blocks)
        self.metrics.hop("prefill", time.perf_counter() - start)
        if not 200 <= resp.status < 300:
            return self._not_ok(worker, "prefill", resp.status, data)
        try:
            parsed = parse(data)
        except BadReply as exc:
            detail = f"prefill {worker}: {exc}"
            raise HopFailed("prefill worker sent a malformed reply", detail, worker, False) from None
        self.pool.request_ok(worker)
        return parsed

    def _not_ok(self, worker: str, hop: str, status: int, data: bytes) -> Reply:
        """A 4xx is the client's mistake: its explanation goes back (no retry, no blame); else the hop failed."""
        if 400 <= status < 500:
            self.pool.request_ok(worker)
            return self._client_error(status, data)
        raise HopFailed(f"{hop} worker answered {status}", f"{hop} {worker} answered {status}", worker, False)

    def _client_error(self, status: int, data: bytes) -> Reply:
        try:
            ok = isinstance(orjson.loads(data), dict)
        except orjson.JSONDecodeError:
            ok = False
        if ok and not any(_host(name) in data for name in self.pool.workers):
            return Reply(status, data)
        return error_reply(status, f"the worker rejected the request (HTTP {status})", "invalid_request_error")

    async def _decode(
        self, ex: Exchange, worker: str, path: str, payload: bytes, stream: bool, hop: str, work: int = 0
    ) -> Answer:
        start = time.perf_counter()
        self.pool.begin(worker, work)
        left = [work]  # prompt blocks still counted as in-flight work: until the first token streams
        try:
            try:
                resp = await self.upstream.post(worker, path, payload, first_byte=stream)
            except UpstreamError as exc:
                raise HopFailed(f"{hop} worker failed", f"{hop} {worker}: {exc}", worker, exc.worker_down) from None
            try:
                if stream and resp.status == 200:
                    return await self._relay(ex, resp.chunks(), worker, hop, start, left)
                try:
                    data = await resp.read()
                except UpstreamError as exc:
                    detail = f"{hop} {worker} broke off: {exc}"
                    raise HopFailed(f"{hop} worker failed", detail, worker, exc.worker_down) from None
                self.metrics.hop(hop, time.perf_counter() - start)
                if not 200 <= resp.status < 300:
                    return self._not_ok(worker, hop, resp.status, data)
                try:
                    data = json_reply(data)
                except BadReply as exc:
                    detail = f"{hop} {worker}: {exc}"
                    raise HopFailed(f"{hop} worker sent a malformed reply", detail, worker, False) from None
                self.pool.request_ok(worker)
                return Reply(resp.status, data)
            finally:
                resp.close()  # back to the pool if complete; else closing it cancels the worker's request
        finally:
            self.pool.end(worker, left[0])

    async def _relay(
        self, ex: Exchange, chunks: AsyncIterator[bytes], worker: str, hop: str, start: float, left: list[int]
    ) -> Answer:
        """Passes whole, checked SSE events through as they arrive; the client sees nothing until the first."""
        sse = SseFilter()
        out: Stream | None = None
        try:
            async for chunk in chunks:
                data = sse.feed(chunk)
                if not data:
                    continue
                if out is None:
                    if left[0]:
                        self.pool.prefilled(worker, left[0])
                        left[0] = 0
                    out = ex.open_stream()
                    ex.first_at = time.perf_counter()
                    self.metrics.hop(f"{hop}_first_byte", ex.first_at - start)
                await out.write(data)
            sse.finish()
            if out is None:  # finish() passed, so an event was sent; kept for the type checker
                raise BadReply("empty stream")
            self.metrics.hop(hop, time.perf_counter() - start)
            self.pool.request_ok(worker)
            await out.write_eof()
            return out
        except (UpstreamError, BadReply) as exc:
            down = isinstance(exc, UpstreamError) and exc.worker_down
            detail = f"{hop} {worker}: {exc}"
            if out is None:
                raise HopFailed(f"{hop} worker failed before its first token", detail, worker, down) from None
            self.blame(worker, down, detail)
            self.metrics.error("decode_midstream")
            await ex.end_stream(sse_error(f"{hop} worker failed mid-stream"))
            return out
        except ConnectionResetError:  # the client left: closing the upstream cancels its request
            self.metrics.error("client_disconnected")
            return out if out is not None else Reply(499)


class _Legs:
    """One disaggregated request's legs for its handoff (xpyd_router.handoff.base.Legs), and what the
    pair's metrics and health learn from them (xpyd_router.pairs)."""

    __slots__ = ("blocks", "decoded", "ex", "hops", "pair", "path", "prefilled_at", "stream", "tokens")

    def __init__(
        self, hops: Hops, ex: Exchange, path: str, stream: bool, blocks: int, prefill: str = "", decode: str = ""
    ) -> None:
        self.hops, self.ex, self.path, self.stream, self.blocks = hops, ex, path, stream, blocks
        self.pair = (prefill, decode)
        hops.metrics.pair(prefill, decode)
        self.prefilled_at = 0.0  # perf_counter() when the prefill hop ended well
        self.tokens = 0  # the prefill reply's usage.prompt_tokens, until counted as handed over
        self.decoded = False

    async def prefill(self, worker: str, payload: bytes, parse: Callable[[bytes], Any]) -> Any:
        if self.hops.metrics.kv_bytes_per_token > 0:
            inner = parse

            def parse(data: bytes) -> Any:
                parsed = inner(data)
                self.tokens = prompt_tokens(data)
                return parsed

        result = await self.hops._prefill(worker, self.path, payload, self.blocks, parse)
        if not isinstance(result, Reply):
            self.prefilled_at = time.perf_counter()
            self._handed()
        return result

    async def decode(self, worker: str, payload: bytes) -> Answer:
        hops, ex = self.hops, self.ex
        ex.first_at = 0.0
        # A decode engine with requests waiting queues this one too: its handoff's latency then holds that queue,
        # the decode pool's saturation, not the pair's data path, so it cannot make the pair slow.
        state = hops.pool.workers.get(worker)
        queued = state is not None and state.waiting > 0
        try:
            answer = await hops._decode(ex, worker, self.path, payload, self.stream, "decode")
        except HopFailed as failed:
            hops.metrics.handoff_failed(*self.pair, "unreachable" if failed.worker_down else "error")
            ex.failed_pair = self.pair
            if hops.pairs is not None:
                hops.pairs.failed(*self.pair, failed.worker_down)
            raise
        if answer.status < 300:
            self.decoded = True
            self._handed()
            # The handoff's latency where the router sees one: two hops in sequence, streamed.
            timed = ex.first_at > 0 and self.prefilled_at > 0 and hops.handoff.name == "nixl"
            seconds = ex.first_at - self.prefilled_at if timed else None
            if seconds is not None:
                hops.metrics.handoff_seconds(*self.pair, seconds)
            if hops.pairs is not None:
                hops.pairs.ok(*self.pair, None if queued else seconds)
        return answer

    def _handed(self) -> None:
        """Counts the prompt's KV as handed over once both legs ended well (SGLang's in either order)."""
        if self.decoded and self.tokens:
            self.hops.metrics.handoff_tokens(*self.pair, self.tokens)
            self.tokens = 0

    def blame(self, failed: HopFailed) -> None:
        self.hops.blame(failed.worker, failed.worker_down, failed.detail)
