"""Bounded load for e2e tests: closed-loop clients against a pool's pods or the router, and bounded waits."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from .kube import find_json as get_json


async def wait_until(what: str, probe: Any, limit_s: float) -> Any:
    """Poll probe() (in a thread: it runs kubectl) until truthy; fail naming what never happened."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        await asyncio.sleep(2)
    raise AssertionError(f"timed out after {limit_s:.0f}s waiting for {what}")


def pod_urls(ns: str, name: str, role: str) -> list[str]:
    """The API endpoints of a pool's running pods that serve one (pod IPs are loopback addresses here).

    A multi-node replica's headless ranks declare no `http` port and are left out.
    """
    pods = get_json("pods", "-n", ns, "-l", f"xpyd.io/deployment={name},xpyd.io/role={role}") or {}
    out = []
    for p in pods.get("items", []):
        ports = {pt.get("name") for c in p["spec"]["containers"] for pt in c.get("ports") or []}
        if p["status"].get("phase") == "Running" and p["status"].get("podIP") and "http" in ports:
            out.append(f"http://{p['status']['podIP']}:8000")
    return out


@dataclass
class Load:
    """A bounded closed-loop load: ``concurrency`` clients, ``limit`` requests at most, on ``role``'s pods.

    Requests go straight to the pool's API pods (spread over those running, re-listed every few
    seconds), so each phase loads exactly the pool it is about, whatever the router does; role
    "router" sends them through the router. Every answer is counted by status code.
    """

    ns: str
    name: str
    role: str
    model: str
    prompt_tokens: int
    max_tokens: int
    concurrency: int
    limit: int = 3000
    sent: int = 0
    ok: int = 0
    codes: dict[str, int] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        urls: list[str] = []

        async def refresh() -> None:
            while not stop.is_set():
                urls[:] = await asyncio.to_thread(pod_urls, self.ns, self.name, self.role)
                await asyncio.sleep(3)

        refresher = asyncio.create_task(refresh())
        async with httpx.AsyncClient(timeout=120) as http:
            await asyncio.gather(*(self._client(http, stop, urls, i) for i in range(self.concurrency)))
        refresher.cancel()

    async def _client(self, http: httpx.AsyncClient, stop: asyncio.Event, urls: list[str], i: int) -> None:
        while not stop.is_set() and self.sent < self.limit:
            if not urls:
                await asyncio.sleep(0.5)
                continue
            self.sent += 1
            url = urls[(i + self.sent) % len(urls)]
            prompt = f"{uuid.uuid4().hex} " + "lorem ipsum " * (self.prompt_tokens * 4 // 12)
            body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens}
            try:
                r = await http.post(f"{url}/v1/completions", json=body)
                self.ok += r.status_code == 200
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
                await asyncio.sleep(0.5)
            self.codes[key] = self.codes.get(key, 0) + 1


async def drive_until(load: Load, what: str, probe: Any, limit_s: float) -> Any:
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    try:
        return await wait_until(what, probe, limit_s)
    finally:
        stop.set()
        await asyncio.wait_for(task, 150)
