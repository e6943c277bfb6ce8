"""Run a command within a time budget: past it, interrupt its children (pytest then tears its fixtures down)
and, after a grace period, kill its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def _children(pid: int) -> list[int]:
    try:
        return [int(kid) for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run_bounded(cmd: Sequence[str], budget_s: float, grace_s: float, cwd: Path) -> tuple[str, bool]:
    """The command's stdout, and whether it finished within `budget_s` (stderr passes through)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(budget_s, 1.0))
        return out, True
    except subprocess.TimeoutExpired:
        pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        for kid in _children(proc.pid):  # SIGINT to the workers, not to the parent that waits on them
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=2.0)
            return out, False
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    return out, False
