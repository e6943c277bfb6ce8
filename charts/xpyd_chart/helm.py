"""Drive the helm binary: find it, render the chart with values, parse the manifests (tests, e2e)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "xpyd-operator"
KUBE_VERSION = "1.31.0"
PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1"


def cached_binary(name: str) -> Path:
    """Where `make tools` builds a binary: $XPYD_CACHE/bin (default ~/.cache/xpyd/bin)."""
    return Path(os.environ.get("XPYD_CACHE", Path.home() / ".cache" / "xpyd")) / "bin" / name


def find_binary(name: str) -> str | None:
    """$<NAME> (e.g. $HELM, $KUBECTL), else the local cluster's cached build, else one on PATH."""
    for candidate in (os.environ.get(name.upper()), str(cached_binary(name)), shutil.which(name)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def helm_binary() -> str | None:
    return find_binary("helm")


def kubectl_binary() -> str | None:
    return find_binary("kubectl")


def run(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run helm with args; never raises on a non-zero exit."""
    binary = helm_binary()
    if binary is None:
        raise RuntimeError("helm not found: set HELM or build it (make cluster)")
    cmd = [binary, *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd, timeout=timeout)


def set_args(values: dict[str, str]) -> list[str]:
    """--set flags for a flat mapping of dotted keys to values (strings via --set-string)."""
    out: list[str] = []
    for key, value in sorted(values.items()):
        flag = "--set" if value in ("true", "false") or value.isdigit() else "--set-string"
        out += [flag, f"{key}={value}"]
    return out


@functools.lru_cache(maxsize=64)
def _template(sets: tuple[tuple[str, str], ...], monitoring: bool, namespace: str) -> str:
    args = ["template", "rel", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    if monitoring:
        args += ["-a", PROMETHEUS_OPERATOR_API]
    result = run(*args, *set_args(dict(sets)))
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr}")
    return result.stdout


def template(
    values: dict[str, str] | None = None, *, monitoring: bool = False, namespace: str = "xpyd-system"
) -> list[dict[str, Any]]:
    """The chart rendered with values, as a list of manifests (empty documents dropped)."""
    text = _template(tuple(sorted((values or {}).items())), monitoring, namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    """Sorted kinds of the manifests."""
    return sorted(str(d["kind"]) for d in docs)


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The single manifest of kind whose name ends with name_suffix."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"want one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]
