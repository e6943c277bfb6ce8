"""Starts, finds and stops the local cluster's long-running processes by pid file, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .paths import Layout

MARKER = "XPYD_LOCAL_CLUSTER"


def _pid_file(layout: Layout, name: str) -> Path:
    return layout.run / f"{name}.pid"


def running(layout: Layout, name: str) -> int | None:
    """The pid of a daemon started by this cluster, if it is alive."""
    try:
        pid = int(_pid_file(layout, name).read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid if _marked(pid, str(layout.state)) else None


def _marked(pid: int, marker: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARKER}={marker}".encode() in environ


def start(layout: Layout, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Start a daemon in its own session, logging to logs/<name>.log, unless it already runs."""
    pid = running(layout, name)
    if pid is not None:
        return pid
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {}), MARKER: str(layout.state)}
    with (layout.logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
            cwd=str(layout.state),
        )
    _pid_file(layout, name).write_text(str(proc.pid))
    return proc.pid


def stop(layout: Layout, name: str, grace: float = 10.0) -> None:
    pid = running(layout, name)
    if pid is not None:
        _terminate([pid], grace)
    _pid_file(layout, name).unlink(missing_ok=True)


def strays(layout: Layout) -> list[int]:
    """Every process carrying this cluster's marker: daemons, pods and their children."""
    marker, me = str(layout.state), os.getpid()
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    return [p for p in pids if _marked(p, marker)]


def _terminate(pids: list[int], grace: float) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_all(layout: Layout, grace: float = 5.0) -> int:
    """Stop every process of this cluster; returns how many there were."""
    pids = strays(layout)
    _terminate(pids, grace)
    return len(pids)


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    where = f"; its log: {log}" if log is not None else ""
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s{where} (make cluster-down, then make cluster-up)")
