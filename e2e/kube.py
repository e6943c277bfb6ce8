"""Small helpers e2e tests share: kubectl, waiting, and knowing whether this is the local cluster."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from xpyd_chart.helm import kubectl_binary

T = TypeVar("T")


def kubectl_path() -> str:
    found = kubectl_binary()
    if found is None:
        raise RuntimeError("kubectl not found: set KUBECTL, put it on PATH or run `make tools`")
    return found


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [kubectl_path(), *args], input=stdin, capture_output=True, text=True, check=False, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def apply(manifests: list[dict[str, Any]], namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    kubectl(*args, stdin=yaml.safe_dump_all(manifests))


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def find_json(*args: str) -> dict[str, Any] | None:
    """`kubectl get ... -o json`, or None when it fails (for example: not found)."""
    result = kubectl("get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


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
