"""Sends trace requests at their (sped-up) arrival times and measures what a client sees."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from xpyd_sim.trace import TraceRequest

from .prompts import prompt_text


@dataclass(frozen=True)
class LoadConfig:
    """Where to send, how fast and how much: every run is bounded in count and time."""

    url: str
    model: str
    speedup: float = 1.0
    max_requests: int = 200
    duration_s: float = 120.0
    max_in_flight: int = 64
    prompt_scale: float = 1.0
    max_output_tokens: int = 256
    timeout_s: float = 120.0
    api_key: str = ""
    spread: tuple[str, ...] = ()  # more router replicas: requests go to url, spread[0], ... in turn
    slo_ttft_s: float = 2.0
    slo_itl_s: float = 0.1

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.spread)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class Outcome:
    """What one request got: status, time to first token, total time, tokens streamed."""

    status: int
    ttft_s: float | None
    total_s: float
    tokens: int
    error: str = ""


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    slo: tuple[float, float] = (2.0, 0.1)  # TTFT and mean inter-token time objectives, seconds

    def met(self, o: Outcome) -> bool:
        if o.status != 200 or o.error or o.ttft_s is None or o.ttft_s > self.slo[0]:
            return False
        return o.tokens <= 1 or (o.total_s - o.ttft_s) / (o.tokens - 1) <= self.slo[1]

    def summary(self) -> dict[str, Any]:
        ok = [o for o in self.outcomes if o.status == 200 and not o.error]
        ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)

        def q(p: float) -> float | None:
            return round(ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))], 4) if ttfts else None

        return {
            "requests": len(self.outcomes),
            "ok": len(ok),
            "errors": len(self.outcomes) - len(ok),
            "ttft_p50_s": q(0.5),
            "ttft_p99_s": q(0.99),
            "slo_attainment": round(sum(map(self.met, self.outcomes)) / len(self.outcomes), 4)
            if self.outcomes
            else None,
            "tokens": sum(o.tokens for o in ok),
            "wall_s": round(self.wall_s, 2),
        }


async def _send(session: aiohttp.ClientSession, cfg: LoadConfig, req: TraceRequest, url: str) -> Outcome:
    body = {
        "model": cfg.model,
        "prompt": prompt_text(req, cfg.prompt_scale),
        "stream": True,
        "max_tokens": max(1, min(req.output_tokens, cfg.max_output_tokens)),
        "ignore_eos": True,
    }
    start = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    try:
        async with session.post(f"{url.rstrip('/')}/v1/completions", json=body, headers=cfg.headers()) as resp:
            if resp.status != 200:
                return Outcome(resp.status, None, time.perf_counter() - start, 0, (await resp.text())[:200])
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Outcome(200, ttft, time.perf_counter() - start, tokens, str(event["error"])[:200])
                if ttft is None:
                    ttft = time.perf_counter() - start
                tokens += 1
            return Outcome(200, ttft, time.perf_counter() - start, tokens)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: a malformed event
        return Outcome(0, ttft, time.perf_counter() - start, tokens, f"{type(exc).__name__}: {exc}")


class Unreachable(Exception):
    """The endpoint does not answer at all: nothing to replay against."""


def check_url(url: str) -> str | None:
    """Why `url` cannot be a router's base URL, or None."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"--url must be an http(s) base URL such as http://127.1.0.5:8000, got {url!r}"
    return None


async def preflight(cfg: LoadConfig, timeout_s: float = 5.0) -> int:
    """GET /v1/models once: the HTTP status if the endpoint answers, else Unreachable naming why."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(f"{cfg.url.rstrip('/')}/v1/models", headers=cfg.headers()) as resp,
        ):
            return resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else " ".join(str(exc).split()) or type(exc).__name__
        raise Unreachable(
            f"cannot reach {cfg.url} ({reason}) within {timeout_s:.0f} s; is the router running?"
        ) from exc


async def run(
    cfg: LoadConfig, requests: Iterable[TraceRequest], on_done: Callable[[Outcome], None] | None = None
) -> LoadResult:
    """Replay `requests` (arrivals relative to the first) until the count or time bound is hit."""
    result = LoadResult(slo=(cfg.slo_ttft_s, cfg.slo_itl_s))
    urls = cfg.urls
    limit = asyncio.Semaphore(cfg.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    connector = aiohttp.TCPConnector(limit=cfg.max_in_flight)
    start = time.perf_counter()
    origin: float | None = None

    async def one(req: TraceRequest, url: str) -> None:
        async with limit:
            outcome = await _send(session, cfg, req, url)
        result.outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks: list[asyncio.Task[None]] = []
        for count, req in enumerate(requests):
            if count >= cfg.max_requests:
                break
            origin = req.arrival if origin is None else origin
            due = (req.arrival - origin) / cfg.speedup
            if due > cfg.duration_s:
                break
            delay = due - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req, urls[count % len(urls)])))
        if tasks:
            await asyncio.wait(tasks, timeout=max(1.0, cfg.duration_s + cfg.timeout_s - (time.perf_counter() - start)))
        for task in tasks:
            task.cancel()
    result.wall_s = time.perf_counter() - start
    return result
