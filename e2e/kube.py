"""Small helpers e2e tests share: kubectl, waiting, and knowing whether this is the local cluster."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import yaml

from xpyd_chart.helm import CHART, kubectl_binary
from xpyd_chart.helm import run as helm

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


@contextlib.contextmanager
def chart_namespace(prefix: str, release: str, *deployments: str) -> Iterator[str]:
    """A fresh namespace with the chart installed as `release`, its operator watching only it (the CRD left to an
    earlier release that owns it); the named DisaggregatedDeployments, the release and the namespace go after."""
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("KUBECONFIG must name the cluster for e2e tests")
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    crd = find_json("crd", "disaggregateddeployments.xpyd.io")
    owner = ((crd or {}).get("metadata", {}).get("annotations") or {}).get("meta.helm.sh/release-name")
    crds = [] if crd is None or owner == release else ["--set", "crds.install=false"]
    args = ["install", release, str(CHART), "-n", ns, "--set", f"operator.watchNamespace={ns}", *crds]
    result = helm(*args, "--wait", "--timeout", "180s", timeout=300)
    assert result.returncode == 0, f"helm install: {result.stderr}"
    try:
        yield ns
    finally:
        for name in deployments:
            kubectl("delete", "dd", name, "-n", ns, "--wait=false", check=False)
        helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s")
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
