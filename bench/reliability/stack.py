"""One `xpyd router` in front of `xpyd emulate` workers, as real processes on 127.0.0.1, for a fault case."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.router.procs import BIN, KV, MODEL, Proc, Procs, free_port, wait_http

HOST = "127.0.0.1"
# Tight hop budgets so a fault shows within a short run; every one is a documented router flag.
ROUTER_FLAGS = ("--connect-timeout", "1", "--first-byte-timeout", "3", "--idle-timeout", "2",
                "--request-timeout", "15", "--direct-below-chars", "0", "--log-level", "WARNING")  # fmt: skip
EMULATOR_ENV = {
    "XPYD_KV_PEERS": HOST,  # the side channels live on 127.0.0.1; any other address is not a peer
    "XPYD_DRAIN_TIMEOUT": "1",  # teardown: leases orphaned by a fault must not hold the exit for 30 s
}


@dataclass
class Stack:
    """The processes of one case; `router` is None for a case that talks to an emulator directly."""

    procs: Procs
    prefill: list[Proc] = field(default_factory=list)
    decode: list[Proc] = field(default_factory=list)
    router: Proc | None = None

    @property
    def url(self) -> str:
        assert self.router is not None
        return self.router.url

    def router_log(self) -> str:
        return self.router.log.read_text(errors="replace") if self.router is not None else ""

    def crashes(self, killed: Sequence[Proc] = ()) -> list[str]:
        """A process that died when the case did not kill it, or a traceback in any log."""
        found = [f"{p.name} exited" for p in self.procs.items if p.popen.poll() is not None and p not in killed]
        logs = {p.name: p.log.read_text("utf-8", "replace") for p in self.procs.items}
        found += [f"traceback in {name}'s log" for name, text in logs.items() if "Traceback" in text]
        return found


def emulator(
    procs: Procs, name: str, speedup: float, flags: Sequence[str] = (), env: dict[str, str] | None = None
) -> Proc:
    """An `xpyd emulate` vLLM worker (NixlConnector) on 127.0.0.1; `flags` go after `vllm serve MODEL`."""
    port = free_port(HOST)
    cmd = [str(BIN / "xpyd"), "emulate", "--speedup", str(speedup), "--log-level", "WARNING", "--",
           "vllm", "serve", MODEL, "--host", HOST, "--port", str(port), "--kv-transfer-config", KV, *flags]  # fmt: skip
    environ = {**EMULATOR_ENV, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(HOST)), **(env or {})}
    return procs.spawn(name, f"http://{HOST}:{port}", cmd, environ)


def router(procs: Procs, prefill: Sequence[str], decode: Sequence[str], flags: Sequence[str] = ()) -> Proc:
    port = free_port(HOST)
    cmd = [str(BIN / "xpyd"), "router", "--host", HOST, "--port", str(port), *ROUTER_FLAGS, *flags]
    cmd += ["--prefill", *prefill] if prefill else []
    cmd += ["--decode", *decode]
    return procs.spawn("router", f"http://{HOST}:{port}", cmd)


async def ready(*items: Proc) -> None:
    """Waits for every process's /health in threads, so stubs served by this loop can answer probes."""
    await asyncio.gather(*(asyncio.to_thread(wait_http, p.url, "/health", 30.0, p) for p in items))


def stop(procs: Procs) -> None:
    """SIGCONT then SIGTERM to all at once, then SIGKILL what is left after 5 s."""
    alive = [p.popen for p in procs.items if p.popen.poll() is None]
    for popen in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            popen.send_signal(signal.SIGTERM)
    for popen in alive:
        try:
            popen.wait(5)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)


@contextlib.asynccontextmanager
async def stack(
    logdir: Path,
    speedup: float,
    prefills: int = 1,
    decodes: int = 2,
    extra_decode: Sequence[str] = (),
    decode_env: dict[str, str] | None = None,
    decode_flags: Sequence[str] = (),
    router_flags: Sequence[str] = (),
) -> AsyncIterator[Stack]:
    """Prefill and decode emulators, then a router over them (and `extra_decode` URLs), until the block exits."""
    await asyncio.to_thread(logdir.mkdir, parents=True, exist_ok=True)
    st = Stack(Procs(logdir))
    try:
        st.prefill = [emulator(st.procs, f"prefill{i}", speedup) for i in range(prefills)]
        st.decode = [emulator(st.procs, f"decode{i}", speedup, decode_flags, decode_env) for i in range(decodes)]
        await ready(*st.prefill, *st.decode)
        urls = [p.url for p in st.decode] + list(extra_decode)
        st.router = router(st.procs, [p.url for p in st.prefill], urls, router_flags)
        await ready(st.router)
        yield st
    finally:
        await asyncio.to_thread(stop, st.procs)
