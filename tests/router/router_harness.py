"""Real parts for the integration tests: `xpyd emulate` worker subprocesses and an in-process router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from xpyd_http.server import Server
from xpyd_router.app import build_app
from xpyd_router.metrics import RouterMetrics
from xpyd_router.policy.registry import KvAwareConfig, KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec
from xpyd_router.proxy import ProxyConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
XPYD = str(Path(sys.executable).with_name("xpyd"))
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class WorkerLike(Protocol):
    """An emulator or a stub: what the router is told about a worker."""

    url: str
    role: str
    domain: str


@dataclass
class Emulator:
    url: str
    proc: subprocess.Popen[bytes]
    role: str = "decode"
    domain: str = ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@dataclass
class Fleet:
    members: list[Emulator] = field(default_factory=list)

    def start(
        self, role: str, domain: str = "", delay: bool = False, speedup: float = 1.0, sglang_bootstrap: int = 0
    ) -> Emulator:
        host = f"127.0.{random.randint(60, 250)}.{random.randint(2, 250)}"
        port = free_port(host)
        flags = ["--speedup", str(speedup)] if delay else ["--zero-delay"]
        env = dict(os.environ, XPYD_NVLINK_DOMAIN=domain, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port(host)))
        cmd = [XPYD, "emulate", *flags, "--log-level", "WARNING", "--"]
        if sglang_bootstrap:  # an SGLang PD worker, paired through the prefill's bootstrap server
            cmd += ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--host", host]
            cmd += ["--port", str(port), "--disaggregation-mode", role]
            cmd += ["--disaggregation-bootstrap-port", str(sglang_bootstrap), "--enable-metrics"]
        else:
            cmd += ["vllm", "serve", MODEL, "--host", host, "--port", str(port), "--kv-transfer-config", KV]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        emulator = Emulator(f"http://{host}:{port}", proc, role, domain)
        self.members.append(emulator)
        return emulator

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for e in self.members:
            while True:
                if e.proc.poll() is not None:
                    err = e.proc.stderr.read().decode(errors="replace") if e.proc.stderr else ""
                    raise RuntimeError(f"emulator {e.url} exited: {err[-2000:]}")
                try:
                    with socket.create_connection(tuple(e.url[7:].split(":")), 0.2):  # type: ignore[arg-type]
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"emulator {e.url} did not start") from None
                    time.sleep(0.05)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    yield f
    for e in f.members:
        e.kill()


@dataclass
class Router:
    url: str
    pool: WorkerPool
    metrics: RouterMetrics

    def sample(self, name: str, **want: str) -> float:
        """The value of one of the router's own series, summed over matching label sets."""
        total = 0.0
        for family in self.metrics.registry.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                    total += s.value
        return total


RouterFactory = Callable[..., "asyncio.Future[Router]"]


@pytest.fixture
async def router() -> AsyncIterator[Callable[..., object]]:
    stack = contextlib.AsyncExitStack()

    async def start(
        workers: Sequence[WorkerLike],
        direct_below_blocks: int = 0,
        max_body_bytes: int = 1 << 20,
        scrape_interval: float = 0.2,
        engine: str = "vllm",
        bootstrap_port: int = 8998,
        header_timeout: float = 15.0,
        max_connections: int = 4096,
        **config: Any,
    ) -> Router:
        pool = WorkerPool(KvAwarePolicy(KvAwareConfig(direct_below_blocks=direct_below_blocks)), 256)
        pool.set_workers([WorkerSpec(e.url, e.role, e.domain) for e in workers])  # type: ignore[arg-type]  # a Role
        metrics = RouterMetrics("test")
        config.setdefault("max_attempts", 3)
        proxy_config = ProxyConfig(engine=engine, bootstrap_port=bootstrap_port, **config)
        app = build_app(pool, metrics, proxy_config, scrape_interval)
        await stack.enter_async_context(app.running())
        server = Server(app.routes, header_timeout, max_connections, max_body_bytes)
        await server.listen("127.0.0.1", 0)
        stack.push_async_callback(server.close, 1.0)
        return Router(f"http://127.0.0.1:{server.port}", pool, metrics)

    async with stack:
        yield start


async def worker_requests(
    session: aiohttp.ClientSession, url: str, series: str = "vllm:request_success_total"
) -> float:
    """Requests one emulator finished: vllm:request_success_total, or another engine's count `series`."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))
