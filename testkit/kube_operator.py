"""The operator against a cluster: install the CRD, run `xpyd operator` as a subprocess, wait for state.

Plain helpers, no pytest fixtures: e2e/operator_fixtures.py wraps them as fixtures for the e2e tests,
and bench/operator/ drives the operator with them. Imports nothing from tests, e2e or bench.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "xpyd.io_disaggregateddeployments.yaml"
XPYD = Path(sys.executable).with_name("xpyd")
DD = create_namespaced_resource("xpyd.io", "v1alpha1", "DisaggregatedDeployment", "disaggregateddeployments")
T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5, what: str = "") -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except ApiError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last  # type: ignore[no-any-return]
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or probe}: last={last!r}")


class Kube:
    """A small synchronous lightkube wrapper for tests and benches."""

    def __init__(self) -> None:
        self.client = Client(config=KubeConfig.from_env(), field_manager="xpyd-e2e")

    def close(self) -> None:
        self.client.close()

    def install_crd(self) -> None:
        crd = yaml.safe_load(CRD_FILE.read_text())
        self.client.patch(
            CustomResourceDefinition, crd["metadata"]["name"], crd, patch_type=PatchType.APPLY, force=True
        )

        def established() -> bool:
            got = self.client.get(CustomResourceDefinition, crd["metadata"]["name"])
            conditions = got.status.conditions if got.status else None
            return any(c.type == "Established" and c.status == "True" for c in conditions or [])

        wait_for(established, 30, what="CRD established")

    def create_namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        ns = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"xpyd.io/e2e": "true"}},
        }
        self.client.patch(Namespace, name, ns, patch_type=PatchType.APPLY)
        return name

    def delete_namespace(self, name: str) -> None:
        try:
            self.client.delete(Namespace, name)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    def apply_dd(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        out = self.client.patch(
            DD, meta["name"], manifest, namespace=meta["namespace"], patch_type=PatchType.APPLY, force=True
        )
        return dict(out.to_dict())  # type: ignore[no-untyped-call]

    def get_dd(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.client.get(DD, name, namespace=namespace).to_dict())  # type: ignore[no-untyped-call]

    def get(self, res: Any, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.client.get(res, name, namespace=namespace).to_dict())
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        status = self.get_dd(namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def dd_manifest(name: str, namespace: str, topology: str = "HGX-B200", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "topology": {"kind": topology},
        "prefill": {"replicas": 1, "gpusPerReplica": 2},
        "decode": {"replicas": 2, "gpusPerReplica": 2},
        "router": {"replicas": 1},
    }
    body.update(spec)
    return {
        "apiVersion": "xpyd.io/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


class OperatorProcess:
    """`xpyd operator` as a child process, watching the given namespaces, logging to a file."""

    def __init__(
        self, namespaces: list[str], log_path: Path, resync_seconds: float = 5.0, extra_args: list[str] | None = None
    ) -> None:
        self.namespaces = namespaces
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        args = [str(XPYD), "operator", "--resync-seconds", str(self.resync_seconds)]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        args += self.extra_args
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash or an OOM kill would leave things."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-n:])
