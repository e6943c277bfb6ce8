"""Turns a Pod into the local process that stands in for its container: pure, no I/O."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpyd_api import labels as L

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
OWN_IMAGES = ("ghcr.io/xpyd/xpyd", "xpyd/xpyd", "localhost/xpyd", "xpyd:")
ENGINE_IMAGES = {"vllm/vllm-openai": ["vllm", "serve"], "lmsysorg/sglang": []}
SHELLS = ("sh", "bash", "dash")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class Probe:
    """An httpGet (or tcpSocket when path is None) probe of the container."""

    port: int
    path: str | None
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start, probe and stop the process of one pod."""

    kind: str  # "engine" (the emulator), "own" (our image) or "placeholder"
    argv: list[str]
    env: dict[str, str]
    sa_mount: str | None
    readiness: Probe | None
    liveness: Probe | None
    grace_seconds: int
    restart: str
    ports: list[int] = field(default_factory=list)
    path: tuple[str, ...] = ()  # directories put first on PATH (the engine shims for a shell command)


@dataclass(frozen=True)
class NodeFacts:
    """What the process kubelet knows of the pod's node and of the API server."""

    name: str
    labels: dict[str, str]
    api_host: str = "127.0.0.1"
    api_port: int = 6443


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, the rest stays.

    Shell syntax such as $((...)) arithmetic and ${VAR:-default} is never a $(NAME) reference, so it passes
    through for the container's shell to evaluate.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(sub, text)


def _field_ref(pod: dict[str, Any], path: str, pod_ip: str) -> str:
    meta = pod.get("metadata", {})
    values = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": "127.0.0.1",
    }
    if path in values:
        return str(values[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    raise ValueError(f"unsupported fieldRef {path!r}")


def container_env(pod: dict[str, Any], container: dict[str, Any], pod_ip: str) -> dict[str, str]:
    """The container's env list resolved in order, with $(VAR) references to earlier entries."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item and item["value"] is not None:
            env[name] = expand(str(item["value"]), env)
        elif (ref := (item.get("valueFrom") or {}).get("fieldRef")) is not None:
            env[name] = _field_ref(pod, ref["fieldPath"], pod_ip)
        elif (item.get("valueFrom") or {}).get("resourceFieldRef") is not None:
            env[name] = "1"
        else:
            env.setdefault(name, "")
    return env


def _probe(spec: dict[str, Any] | None, ports: dict[str, int]) -> Probe | None:
    if not spec:
        return None
    action = spec.get("httpGet") or spec.get("tcpSocket")
    if action is None:
        return None
    raw = action.get("port")
    port = ports[raw] if isinstance(raw, str) and not raw.isdigit() else int(raw)
    return Probe(
        port=port,
        path=(spec["httpGet"].get("path") or "/") if "httpGet" in spec else None,
        initial_delay=float(spec.get("initialDelaySeconds") or 0),
        period=float(spec.get("periodSeconds") or 10),
        timeout=float(spec.get("timeoutSeconds") or 1),
        failure_threshold=int(spec.get("failureThreshold") or 3),
    )


def classify(image: str) -> str:
    """Our image runs as itself, a vLLM or SGLang image runs the emulator, anything else a placeholder."""
    if any(image.startswith(p) for p in OWN_IMAGES):
        return "own"
    if any(image.startswith(p) for p in ENGINE_IMAGES):
        return "engine"
    return "placeholder"


def _sa_mount(pod: dict[str, Any], container: dict[str, Any]) -> str | None:
    projected = {
        v["name"]
        for v in pod.get("spec", {}).get("volumes") or []
        if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])
    }
    for mount in container.get("volumeMounts") or []:
        if mount.get("name") in projected:
            return str(mount["mountPath"])
    return None


def is_shell(command: list[str]) -> bool:
    """True for `sh -c ...` and the like: the shell itself must run, to expand $((...)) and ${...}."""
    return bool(command) and Path(command[0]).name in SHELLS


def _argv(kind: str, full: list[str], ports: list[str], pod_ip: str, xpyd: str) -> list[str]:
    """The process for the container's command+args (`full`): the emulator, ourselves, or a placeholder."""
    if kind == "engine":  # a shell's `vllm` / `python3 -m sglang.launch_server` resolve to the shims
        return full if is_shell(full) else [xpyd, "emulate", "--", *full]
    if kind == "own":
        return [xpyd, *full[1:]] if Path(full[0]).name == "xpyd" else full
    return [sys.executable, "-m", "xpyd_cluster.placeholder", "--host", pod_ip, *(ports or ["80"])]


def plan(
    pod: dict[str, Any],
    pod_ip: str,
    node: NodeFacts,
    xpyd: str | None = None,
    *,
    shims: str | None = None,
    hosts_file: str | None = None,
) -> LaunchPlan:
    """The launch plan of the pod's first container, bound to pod_ip.

    shims: the directory of engine shims an engine image's shell command finds first on PATH;
    hosts_file: the kubelet's pod host names, named to the process in XPYD_HOSTS_FILE.
    """
    spec = pod["spec"]
    container = spec["containers"][0]
    image = str(container.get("image", ""))
    kind = classify(image)
    xpyd = xpyd or str(Path(sys.executable).with_name("xpyd"))
    ports = {p.get("name", str(p["containerPort"])): int(p["containerPort"]) for p in container.get("ports") or []}
    env = {
        "KUBERNETES_SERVICE_HOST": node.api_host,
        "KUBERNETES_SERVICE_PORT": str(node.api_port),
        "HOSTNAME": pod["metadata"]["name"],
        "POD_IP": pod_ip,
        "XPYD_BIND_HOST": pod_ip,
        L.ENV_NODE_NAME: node.name,
        L.ENV_NVLINK_DOMAIN: L.nvlink_domain(node.name, node.labels),
    }
    if hosts_file:
        env[L.ENV_HOSTS_FILE] = hosts_file
    product = node.labels.get(L.GPU_PRODUCT, "")
    if product:
        env[L.ENV_GPU] = product.removeprefix("NVIDIA-").split("-")[0]
    env.update(container_env(pod, container, pod_ip))
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if not command:  # the image's entrypoint
        command = ["xpyd"] if kind == "own" else next((v for k, v in ENGINE_IMAGES.items() if image.startswith(k)), [])
    full = command + args
    argv = _argv(kind, full, [str(p) for p in ports.values()], pod_ip, xpyd)
    return LaunchPlan(
        kind=kind,
        argv=argv,
        env=env,
        sa_mount=_sa_mount(pod, container),
        readiness=_probe(container.get("readinessProbe"), ports),
        liveness=_probe(container.get("livenessProbe"), ports),
        grace_seconds=int(spec.get("terminationGracePeriodSeconds", 30)),
        restart=str(spec.get("restartPolicy", "Always")),
        ports=sorted(ports.values()),
        path=(shims,) if shims and kind == "engine" and is_shell(full) else (),
    )
