"""Emulator benchmark: zero-delay req/s vs a bare aiohttp handler, streamed tokens/s, RSS with a full
prefix index; also writes the Llama-3.1-70B break-even table. One command, under two minutes:

    .venv/bin/python bench/emulator/run.py

Servers run as subprocesses pinned to CPU 0, the load generator to CPU 1 (when there are two).
Results go to bench/results/emulator.md, emulator.json and plan.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from loadgen import load  # type: ignore[import-not-found]

from xpyd_perf import break_even

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable
HOST = "127.0.0.1"
CONCURRENCY = 64
ROUND_SECONDS = 3.0
SERVER_CPU = 0


def _port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        args, preexec_fn=lambda: _pin(SERVER_CPU), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"server died: {proc.stderr.read().decode() if proc.stderr else ''}") from None
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not start")


def emulator(
    port: int, model: str, *extra: str, zero_delay: bool = True, speedup: float = 1.0
) -> subprocess.Popen[bytes]:
    flags = ["--zero-delay"] if zero_delay else ["--speedup", str(speedup)]
    cmd = [PY, "-m", "xpyd_cli.main", "emulate", *flags, "--log-level", "WARNING", "--", "vllm", "serve", model,
           "--host", HOST, "--port", str(port), *extra]  # fmt: skip
    return start(cmd, port)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (to normalise throughput on a shared machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(proc: subprocess.Popen[bytes], port: int, path: str, body: bytes) -> tuple[float, float]:
    """(requests/s of wall time, requests per CPU-second of the server) for one round."""
    before = cpu_seconds(proc.pid)
    r = await load(HOST, port, path, body, CONCURRENCY, ROUND_SECONDS)
    assert r["errors"] == 0, r
    return r["rps"], r["requests"] / max(cpu_seconds(proc.pid) - before, 1e-9)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def fill_index(port: int, prompts: int, tokens: int) -> int:
    """Send unique long prompts until the prefix index is full; returns the index size."""
    url = f"http://{HOST}:{port}"
    async with aiohttp.ClientSession() as http:
        sem = asyncio.Semaphore(4)

        async def one(i: int) -> None:
            body = {"prompt": f"{i:016d}" + "y" * (tokens * 4 - 16), "max_tokens": 1}
            async with sem, http.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()

        await asyncio.gather(*(one(i) for i in range(prompts)))
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("xpyd_emulator_prefix_index_blocks"))
    return int(float(line.split()[-1]))


def num_blocks_of(port: int) -> int:
    import urllib.request

    text = urllib.request.urlopen(f"http://{HOST}:{port}/metrics").read().decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info"))
    return int(line.split('num_gpu_blocks="')[1].split('"')[0])


async def bench() -> dict[str, Any]:
    _pin(1)
    out: dict[str, Any] = {"concurrency": CONCURRENCY, "round_seconds": ROUND_SECONDS}
    small = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Say hello to the benchmark. " * 5,
                        "max_tokens": 16}).encode()  # fmt: skip
    bare_port, emu_port = _port(), _port()
    bare = start([PY, str(Path(__file__).parent / "bare_server.py"), HOST, str(bare_port)], bare_port)
    emu = emulator(emu_port, "meta-llama/Llama-3.1-8B-Instruct")
    try:
        await load(HOST, bare_port, "/v1/completions", small, CONCURRENCY, 1.0)  # warm-up
        await load(HOST, emu_port, "/v1/completions", small, CONCURRENCY, 1.0)
        bare_runs, emu_runs = [], []
        for _ in range(3):  # interleaved rounds: both see the same background load
            bare_runs.append(await measured(bare, bare_port, "/v1/completions", small))
            emu_runs.append(await measured(emu, emu_port, "/v1/completions", small))
        out["bare_rps"] = max(r[0] for r in bare_runs)
        out["emulator_rps"] = max(r[0] for r in emu_runs)
        out["rps_ratio"] = out["emulator_rps"] / out["bare_rps"]
        out["bare_req_per_cpu_s"] = max(r[1] for r in bare_runs)
        out["emulator_req_per_cpu_s"] = max(r[1] for r in emu_runs)
        out["cpu_ratio"] = out["emulator_req_per_cpu_s"] / out["bare_req_per_cpu_s"]
        stream = json.dumps({"prompt": "Stream please. " * 5, "max_tokens": 256, "stream": True}).encode()
        s = await load(HOST, emu_port, "/v1/completions", stream, CONCURRENCY, ROUND_SECONDS)
        assert s["sample_text_chunks"] == 256, s
        out["stream_tokens_per_s_zero_delay"] = s["requests"] * 256 / s["seconds"]
    finally:
        bare.terminate()
        emu.terminate()
        bare.wait()
        emu.wait()
    eng_port = _port()
    eng = emulator(eng_port, "meta-llama/Llama-3.1-8B-Instruct", zero_delay=False, speedup=1000.0)
    try:
        stream = json.dumps({"prompt": "Stream please. " * 5, "max_tokens": 256, "stream": True}).encode()
        s = await load(HOST, eng_port, "/v1/completions", stream, CONCURRENCY, ROUND_SECONDS)
        out["stream_tokens_per_s_engine_x1000"] = s["requests"] * 256 / s["seconds"]
    finally:
        eng.terminate()
        eng.wait()
    out["rss"] = []
    for model, extra in (
        ("meta-llama/Llama-3.1-70B-Instruct", ["-tp", "8"]),
        ("deepseek-ai/DeepSeek-V3", ["-tp", "8"]),
    ):
        port = _port()
        proc = emulator(port, model, *extra)
        try:
            idle = rss_mb(proc.pid)
            blocks = num_blocks_of(port)
            tokens = 32768
            index = await fill_index(port, blocks * 16 // tokens + 2, tokens)
            out["rss"].append({"model": model, "num_gpu_blocks": blocks, "index_blocks": index,
                               "rss_idle_mb": idle, "rss_full_mb": rss_mb(proc.pid)})  # fmt: skip
        finally:
            proc.terminate()
            proc.wait()
    return out


def write_emulator_md(r: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {x['model']} (TP8, B200) | {x['num_gpu_blocks']:,} | {x['index_blocks']:,} | {x['rss_idle_mb']:.0f} | "
        f"{x['rss_full_mb']:.0f} |"
        for x in r["rss"]
    )
    measures = [
        ("bare aiohttp handler, non-streamed", f"{r['bare_rps']:,.0f} req/s ({r['bare_req_per_cpu_s']:,.0f} per CPU-s)",
         "baseline"),
        ("emulator `--zero-delay`, non-streamed `/v1/completions` (16 tokens)",
         f"{r['emulator_rps']:,.0f} req/s ({r['emulator_req_per_cpu_s']:,.0f} per CPU-s)", ""),
        ("emulator / bare, per CPU-second of the server (one core)", f"**{100 * r['cpu_ratio']:.0f}%**", ">= 60%"),
        ("emulator / bare, wall-clock req/s", f"{100 * r['rps_ratio']:.0f}%", "(noisy on a shared box)"),
        ("streamed tokens/s, zero-delay (64 streams x 256 tokens)",
         f"**{r['stream_tokens_per_s_zero_delay']:,.0f}**", ">= 50,000"),
        ("streamed tokens/s, engine on the virtual clock at `--speedup 1000`",
         f"{r['stream_tokens_per_s_engine_x1000']:,.0f}", "(info)"),
    ]  # fmt: skip
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in measures)
    return f"""# Emulator benchmark

Command: `.venv/bin/python bench/emulator/run.py` (servers pinned to CPU 0, load generator on CPU 1;
a raw-asyncio keep-alive HTTP/1.1 client, concurrency {r["concurrency"]}, best of 3 interleaved
{r["round_seconds"]:.0f}-second rounds). Machine: 2 shared cores, so absolute numbers move with the other
work on the box; the ratio is measured in the same run.

| measure | result | goal |
|---|---|---|
{table}

RSS with the prefix index filled to capacity (unique 32k-token prompts until every block is indexed):

| model | num_gpu_blocks | index blocks | RSS idle MB | RSS full MB |
|---|---|---|---|---|
{rows}

Goal: RSS < 100 MB with a full index.
"""


def write_plan_md() -> str:
    head = "| topology | prompt | KV GB | path | transfer ms | prefill ms | stall ms | transfer/prefill | verdict |"
    lines = ["# Break-even: Llama-3.1-70B, HGX-B200 vs GB200-NVL72 (8 GPUs per replica, TP8)", "",
             "Generated by `bench/emulator/run.py` from `xpyd_perf.break_even` "
             "(disaggregate iff t_transfer < t_stall).", "", head, "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for topo in ("HGX-B200", "GB200-NVL72"):
        for n in (2048, 8192, 32768, 131072):
            b = break_even("llama-3.1-70b", topo, n)
            path = "NVLink" if b.kv_path == "NVLink" else f"RDMA x{b.lanes} NICs"
            lines.append(
                f"| {topo} | {n:,} | {b.kv_bytes / 1e9:.2f} | {path} | {b.transfer_seconds * 1e3:.1f} | "
                f"{b.prefill_seconds * 1e3:.1f} | {b.stall_seconds * 1e3:.1f} | {100 * b.transfer_over_prefill:.1f}% | "
                f"{'disaggregate' if b.disaggregate else 'colocate'} |"
            )
    lines += ["", "Model constants: MFU 0.40 of dense BF16 peak, HBM efficiency 0.80, NVLink 0.88 x 900 GB/s per "
              "direction, NIC 50 GB/s per direction, one NIC per GPU (the cache split by heads over 8 rails), "
              "stall = decode time lost by 32 co-located streams at 2k context while the prompt is chunk-prefilled "
              "(8192-token chunks).", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "plan.md").write_text(write_plan_md())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    started = time.time()
    result = asyncio.run(bench())
    result["wall_seconds"] = time.time() - started
    (RESULTS / "emulator.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "emulator.md").write_text(write_emulator_md(result))
    print(write_emulator_md(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
