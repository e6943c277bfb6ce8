"""The process kubelet's pod runner as a kubelet has it: startup gates the other probes, readiness takes
failureThreshold misses to drop, and a pod's preStop hook runs before its SIGTERM."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from xpyd_cluster import podspec
from xpyd_cluster.podrun import PodRunner

POD: dict[str, Any] = {
    "metadata": {"name": "p-0", "namespace": "ns", "uid": "u1"},
    "spec": {"containers": [{"name": "main", "image": "x"}]},
}


class FakeClient:
    """Records the readiness the runner reports."""

    def __init__(self) -> None:
        self.ready: list[bool] = []

    async def patch(self, _res: Any, _name: str, body: dict[str, Any], namespace: str) -> None:
        self.ready.append(body["status"]["containerStatuses"][0]["ready"])


class Health:
    """/ready and /started on 127.0.0.1, each answering 200 or 503 as told."""

    def __init__(self) -> None:
        self.ok = {"/ready": True, "/started": True}
        self.hits = {"/ready": 0, "/started": 0}

    async def handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        return web.Response(status=200 if self.ok[request.path] else 503)


@pytest.fixture
async def health() -> AsyncIterator[tuple[Health, int]]:
    h = Health()
    app = web.Application()
    app.router.add_get("/ready", h.handle)
    app.router.add_get("/started", h.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()  # bound here, so its port is known without the server's private attributes
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    yield h, int(sock.getsockname()[1])
    await runner.cleanup()


def launch(argv: list[str], **plan: Any) -> podspec.LaunchPlan:
    fields: dict[str, Any] = {"kind": "own", "argv": argv, "env": {}, "sa_mount": None, "readiness": None,
                              "liveness": None, "grace_seconds": 5, "restart": "Always", **plan}  # fmt: skip
    return podspec.LaunchPlan(**fields)


async def until(check: Any, limit: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_readiness_drops_only_after_failure_threshold_misses(health: tuple[Health, int], tmp_path: Path) -> None:
    h, port = health
    client = FakeClient()
    probe = podspec.Probe(port=port, path="/ready", period=0.05, failure_threshold=3)
    runner = PodRunner(client, POD, launch(SLEEPER, readiness=probe), "127.0.0.1", tmp_path, tmp_path / "ca", "m")  # type: ignore[arg-type]
    runner.start()
    try:
        await until(lambda: runner.ready)
        h.ok["/ready"] = False
        seen = h.hits["/ready"]
        await until(lambda: h.hits["/ready"] >= seen + 2)
        assert runner.ready  # two misses: still ready
        await until(lambda: not runner.ready)
        assert h.hits["/ready"] >= seen + 3
        h.ok["/ready"] = True
        await until(lambda: runner.ready)  # one success brings it back
    finally:
        await runner.stop(1.0)


async def test_startup_probe_holds_readiness_back_until_it_passes(health: tuple[Health, int], tmp_path: Path) -> None:
    h, port = health
    h.ok["/started"] = False
    client = FakeClient()
    plan = launch(
        SLEEPER,
        readiness=podspec.Probe(port=port, path="/ready", period=0.05),
        liveness=podspec.Probe(port=port, path="/ready", period=0.05),
        startup=podspec.Probe(port=port, path="/started", period=0.05, failure_threshold=1000),
    )
    runner = PodRunner(client, POD, plan, "127.0.0.1", tmp_path, tmp_path / "ca", "m")  # type: ignore[arg-type]
    runner.start()
    try:
        await until(lambda: h.hits["/started"] >= 2)
        assert h.hits["/ready"] == 0 and not runner.ready
        h.ok["/started"] = True
        await until(lambda: runner.ready)
    finally:
        await runner.stop(1.0)


async def test_pre_stop_hook_runs_before_sigterm(tmp_path: Path) -> None:
    order = tmp_path / "order"
    server = (
        "import pathlib, signal, sys, time\n"
        f"p = pathlib.Path({str(order)!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: (p.open('a').write('term\\n'), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    hook = ["/bin/sh", "-c", f"sleep 0.3; echo hook >> {order}"]
    plan = launch([sys.executable, "-c", server], pre_stop=hook)
    runner = PodRunner(FakeClient(), POD, plan, "127.0.0.1", tmp_path, tmp_path / "ca", "m")  # type: ignore[arg-type]
    runner.start()
    await until(lambda: runner.proc is not None)
    await asyncio.sleep(0.5)  # the server has set its handler
    await runner.stop(5.0, hook=True)
    assert order.read_text().split() == ["hook", "term"]


async def test_shutdown_without_the_hook_stops_at_once(tmp_path: Path) -> None:
    order = tmp_path / "order"
    plan = launch(SLEEPER, pre_stop=["/bin/sh", "-c", f"echo hook >> {order}"])
    runner = PodRunner(FakeClient(), POD, plan, "127.0.0.1", tmp_path, tmp_path / "ca", "m")  # type: ignore[arg-type]
    runner.start()
    await until(lambda: runner.proc is not None)
    await runner.stop(1.0)
    assert not order.exists()
