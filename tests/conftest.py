"""Fixtures for every test folder: a real emulated vLLM worker process on a loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import pytest

# testkit/ (shared with e2e and bench) and bench/ (the fault cases tests/reliability runs) are imported from the
# repository root, which pytest does not put on sys.path for tests/ (a folder of test folders, not a package).
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# Run alone, after the rest (`make unit` runs the rest in parallel with pytest-xdist): the real vLLM, the fault
# cases that start a router and several workers each and count what they lose, and the autoscaler's queries
# against a real Prometheus scraping every second; beside other tests on a busy machine they miss their deadlines.
SERIAL: tuple[str, ...] = ("realengine/", "reliability/", "autoscaler/test_prometheus_real.py")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.resolve()
        if where.is_relative_to(TESTS) and where.relative_to(TESTS).as_posix().startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def emulated_worker(model: str, *extra: str, domain: str = "", speedup: float = 1.0) -> Iterator[str]:
    """One `xpyd emulate` B200 vLLM worker, bound to loopback; yields its base URL.

    `speedup` below 1 runs modelled time in slow motion (0.5: every step takes twice as long), so
    the emulator's own Python work on a busy machine stays small beside the steps it models."""
    port = free_port()
    env = {**os.environ, "XPYD_BIND_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    if domain:
        env |= {"XPYD_NVLINK_DOMAIN": domain, "XPYD_NODE_NAME": domain}
    cmd = [sys.executable, "-m", "xpyd_cli.main", "emulate", "--gpu", "B200", "--speedup", str(speedup), "--",
           "vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"emulator did not come up: {err[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


@pytest.fixture(scope="session")
def emulate() -> Callable[..., AbstractContextManager[str]]:
    """`with emulate(model, *vllm_args, domain=..., speedup=...) as url:` runs one emulated worker process."""
    return emulated_worker
