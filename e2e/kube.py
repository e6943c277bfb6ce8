"""Small helpers e2e tests share: kubectl, waiting, and knowing whether this is the local cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
CACHE_BIN = Path(os.environ.get("XPYD_CACHE", Path.home() / ".cache" / "xpyd")) / "bin"


def kubectl_path() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    if (CACHE_BIN / "kubectl").exists():
        return str(CACHE_BIN / "kubectl")
    raise RuntimeError("kubectl not found on PATH nor in the local cluster's cache")


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([kubectl_path(), *args], input=stdin, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def apply(manifests: list[dict[str, Any]], namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    kubectl(*args, stdin=yaml.safe_dump_all(manifests))


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Poll `check` until it returns a truthy value; fail naming `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def is_local_cluster() -> bool:
    """True on xpyd's local cluster, whose nodes carry xpyd.io/local-node and whose pods run on loopback."""
    nodes = get_json("nodes", "-l", "xpyd.io/local-node=true")
    return bool(nodes["items"])


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def ready_pod(namespace: str, name: str) -> dict[str, Any] | None:
    """The pod if it is Ready, else None: for wait_until."""
    pod: dict[str, Any] = get_json("pod", name, "-n", namespace)
    return pod if pod_ready(pod) else None
