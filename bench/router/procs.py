"""Starting and measuring the processes of a router benchmark: emulators, routers, CPU time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
PEERS_ROUTER = Path(__file__).resolve().parents[1] / "baselines" / "router.py"  # xpyd router + llm-d, sglang
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    bootstrap: int = 0  # SGLang prefill bootstrap port (0: a vLLM worker)

    def cpu(self) -> float:
        return cpu_seconds(self.popen.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


@dataclass
class Procs:
    logdir: Path
    items: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, url: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.logdir / f"{name}.log"
        out = log.open("wb")
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        out.close()
        proc = Proc(name, url, popen, log)
        self.items.append(proc)
        return proc

    def emulator(
        self,
        name: str,
        host: str,
        zero_delay: bool,
        speedup: float = 1.0,
        domain: str = "",
        model: str = MODEL,
        args: tuple[str, ...] = (),
        sglang_mode: str = "",
    ) -> Proc:
        port = free_port(host)
        flags = ["--zero-delay"] if zero_delay else ["--speedup", str(speedup)]
        cmd = [str(BIN / "xpyd"), "emulate", *flags, "--log-level", "WARNING", "--"]
        bootstrap = 0
        if sglang_mode:  # an SGLang worker in PD mode (bootstrap pairing)
            bootstrap = free_port(host)
            cmd += ["python3", "-m", "sglang.launch_server", "--model-path", model, "--host", host]
            cmd += ["--port", str(port), "--disaggregation-mode", sglang_mode]
            cmd += ["--disaggregation-bootstrap-port", str(bootstrap), *args]
        else:
            cmd += ["vllm", "serve", model, "--host", host, "--port", str(port), "--kv-transfer-config", KV, *args]
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(host)),
            "XPYD_NVLINK_DOMAIN": domain,
            "XPYD_NODE_NAME": domain,
        }
        proc = self.spawn(name, f"http://{host}:{port}", cmd, env)
        proc.bootstrap = bootstrap
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.items):
            proc.stop()
        self.items.clear()


def wait_http(url: str, path: str = "/health", timeout: float = 60.0, proc: Proc | None = None) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {proc.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + path, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}{path} not ready after {timeout}s")
        time.sleep(0.1)


def _prom() -> list[str]:
    return ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port("127.0.0.1"))]


def wait_port(url: str, timeout: float = 30.0) -> None:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), 0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not listening after {timeout}s") from None
            time.sleep(0.05)


def router_command(kind: str, port: int, prefill: list[str], decode: list[str], extra: list[str]) -> list[str]:
    """The command line of one router under test, in PD mode over the same workers."""
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if not prefill:  # a single pool: `decode` lists co-located workers, one hop each
        if kind.startswith("xpyd"):
            return [str(BIN / "xpyd"), "router", *host, "--worker", *decode, *extra]
        if kind.startswith("sglang"):
            cmd = [str(BIN / "python"), "-m", "sglang_router.launch_router", *host, "--worker-urls", *decode]
            return [*cmd, "--log-level", "error", *_prom(), *extra]
        if kind.startswith("vllm"):
            return [str(BIN / "vllm-router"), *host, "--worker-urls", *decode, "--log-level", "error", *_prom(), *extra]
    if kind == "xpyd":
        return [str(BIN / "xpyd"), "router", *host, "--prefill", *prefill, "--decode", *decode, *extra]
    if kind == "xpyd-peers":  # the same router with the peers' policies registered (bench/baselines)
        return [str(BIN / "python"), str(PEERS_ROUTER), *host, "--prefill", *prefill, "--decode", *decode, *extra]
    if kind.startswith("sglang"):
        cmd = [str(BIN / "python"), "-m", "sglang_router.launch_router", *host, "--pd-disaggregation"]
        for url in prefill:
            cmd += ["--prefill", *url.split(" ")]  # "URL BOOTSTRAP_PORT"
        for url in decode:
            cmd += ["--decode", url]
        return [*cmd, "--log-level", "error", *_prom(), *extra]
    if kind.startswith("vllm"):
        cmd = [str(BIN / "vllm-router"), *host, "--vllm-pd-disaggregation", "--kv-connector", "nixl"]
        for url in prefill:
            cmd += ["--prefill", url]
        for url in decode:
            cmd += ["--decode", url]
        return [*cmd, "--log-level", "error", *_prom(), *extra]
    raise ValueError(f"unknown router kind {kind!r}")
