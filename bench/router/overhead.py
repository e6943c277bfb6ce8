"""Proxy overhead at fixed concurrency on zero-delay emulators: xpyd vs direct vs PyPI peer routers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from procs import BIN, MODEL, Proc, Procs, free_port, router_command, wait_http  # type: ignore[import-not-found]

ROUTERS: list[tuple[str, str, list[str]]] = [
    ("xpyd kv-aware", "xpyd", ["--direct-below-chars", "0", "--scrape-interval", "1"]),
    ("xpyd kv-aware (SGLang bootstrap)", "xpyd-sglang", ["--direct-below-chars", "0", "--engine", "sglang"]),
    ("sglang-router cache_aware", "sglang", ["--policy", "cache_aware"]),
    ("sglang-router round_robin", "sglang", ["--policy", "round_robin"]),
    ("vllm-router cache_aware", "vllm", ["--policy", "cache_aware"]),
    ("vllm-router round_robin", "vllm", ["--policy", "round_robin"]),
]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def load(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    spec = {"mode": "closed", "url": url + "/v1/completions", "bodies": bodies, "concurrency": concurrency}
    here = Path(__file__).with_name("loadgen.py")
    out = subprocess.run(
        [str(BIN / "python"), str(here)], input=json.dumps(spec).encode(), capture_output=True, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def bodies(n: int, stream: bool, tag: str) -> list[dict[str, Any]]:
    text = " hello world, this is a short benchmark prompt." * 5
    return [
        {"model": MODEL, "prompt": f"{tag}-{i}{text}", "max_tokens": 16, "stream": stream, "ignore_eos": True}
        for i in range(n)
    ]


def _spawn(procs: Procs, label: str, kind: str, extra: list[str], path: str, workers: dict[str, Proc]) -> Proc:
    port = free_port("127.0.0.1")
    if path == "single-pool":  # one co-located worker, one hop
        pd: tuple[list[str], list[str]] = ([], [workers["single"].url])
        extra = [x for x in extra if x not in ("--engine", "sglang")]
        kind = kind.removesuffix("-sglang")
    elif kind == "sglang":
        pd = [f"{workers['sgl-prefill'].url} {workers['sgl-prefill'].bootstrap}"], [workers["sgl-decode"].url]
    elif kind == "xpyd-sglang":
        kind, pd = "xpyd", ([workers["sgl-prefill"].url], [workers["sgl-decode"].url])
        extra = [*extra, "--bootstrap-port", str(workers["sgl-prefill"].bootstrap)]
    else:
        pd = [workers["prefill"].url], [workers["decode"].url]
    cmd = router_command(kind, port, pd[0], pd[1], extra)
    return procs.spawn(f"{label}-{path}".replace(" ", "_"), f"http://127.0.0.1:{port}", cmd)


def run(
    logdir: Path,
    n: int = 1000,
    concurrency: int = 64,
    only: tuple[str, ...] = (),
    streams: tuple[bool, ...] = (False, True),
    paths: tuple[str, ...] = ("two-hop",),
    rotate: int = 0,
) -> list[dict[str, Any]]:
    """CPU per request and added latency of each router on each path (two-hop prefill/decode, single
    pool), streamed or not, all in this one run on the same zero-delay emulators; `rotate` shifts the
    order the routers are measured in (rounds of a comparison rotate it, so no router always goes first)."""
    procs = Procs(logdir)
    rows: list[dict[str, Any]] = []
    try:
        workers = {
            "prefill": procs.emulator("ovh-prefill", "127.0.81.2", zero_delay=True),
            "decode": procs.emulator("ovh-decode", "127.0.81.3", zero_delay=True),
            "single": procs.emulator("ovh-single", "127.0.81.6", zero_delay=True),
        }
        if "two-hop" in paths:  # SGLang-mode workers for the routers that speak SGLang's bootstrap protocol
            workers["sgl-prefill"] = procs.emulator("ovh-sgl-prefill", "127.0.81.4", True, sglang_mode="prefill")
            workers["sgl-decode"] = procs.emulator("ovh-sgl-decode", "127.0.81.5", True, sglang_mode="decode")
        for e in workers.values():
            wait_http(e.url, proc=e)
        for path in paths:
            routers = []
            for label, kind, extra in ROUTERS:
                if (only and not label.startswith(only)) or (path == "single-pool" and "bootstrap" in label):
                    continue
                routers.append((label, _spawn(procs, label, kind, extra, path, workers)))
            available = []
            for label, proc in routers:
                try:
                    wait_http(proc.url, "/health", 60, proc)
                    available.append((label, proc))
                except (RuntimeError, TimeoutError) as exc:
                    rows.append({"router": label, "path": path, "error": str(exc)[:300]})
            direct = workers["single" if path == "single-pool" else "decode"]
            for stream in streams:
                shift = rotate % len(available) if available else 0
                ordered = available[shift:] + available[:shift]
                targets = [("direct (worker)", direct.url, None), *[(lb, p.url, p) for lb, p in ordered]]
                for label, url, proc in targets:
                    load(url, bodies(min(200, n), stream, "warm"), concurrency)
                    before = proc.cpu() if proc else 0.0
                    out = load(url, bodies(n, stream, label[:6]), concurrency)
                    cpu = (proc.cpu() - before) if proc else 0.0
                    lat = [r[1] for r in out["results"] if r[2]]
                    rows.append({
                        "router": label, "path": path, "stream": stream, "ok": len(lat), "n": n,
                        "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
                        "rps": len(lat) / out["elapsed"], "cpu_us_per_req": cpu / n * 1e6,
                    })  # fmt: skip
                    print(f"overhead {path} {label} stream={stream}: {rows[-1]}", file=sys.stderr, flush=True)
            for _, proc in routers:
                proc.stop()
    finally:
        procs.stop_all()
    return rows
