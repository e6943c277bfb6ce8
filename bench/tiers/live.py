"""One command: the KV-tier benchmark live, scaled down, on emulators behind the real router; writes
bench/results/kv-tiers-live.md.

    .venv/bin/python bench/tiers/live.py [--quick] [--out FILE]

Four co-located emulated vLLM workers (Llama-3.1-8B on H100, small GPU KV caches) on loopback
addresses, each publishing its KV events, behind `xpyd router` (kv-aware, the engines' events in its
index). Two shapes, each under four arms, fresh workers and router per run:

- llm-d's prefix groups, scaled down: 8K-token shared prefixes whose working set is 1.32x the four
  workers' GPU KV, every group asked once first (a warm-up pass, not measured), then random groups;
- long private prefixes: 16K-token documents, each asked about once or (half of them) twice.

Arms: no offload; offload (vLLM's `--kv-offloading-size`, native backend) with the router scoring
GPU-held blocks only; offload with the router pricing a CPU-held block's reload
(`--cpu-tier-gpu/--cpu-tier-model`, as the operator renders them); offload with llm-d's fixed weight
(`--cpu-tier-weight 0.4`). Hit ratios are the workers' own counters: GPU hits
(`vllm:prefix_cache_hits_total`) and CPU-tier reloads (`xpyd_emulator_cpu_tier_hits_total`) over
prompt tokens queried. About 5 minutes on the shared 2-core machine, most of it starting workers and
waiting on arrivals; --quick (10 s of load per run instead of 20) a little less.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "router"))

from bench.cache.live import MODEL_8B, _bodies, _emulators, _replay, scrub  # noqa: E402
from bench.tiers import shapes  # noqa: E402
from procs import Procs, free_port, router_command, wait_http  # type: ignore[import-not-found]  # noqa: E402
from replay import pct, scrape  # type: ignore[import-not-found]  # noqa: E402

OUT = ROOT / "bench" / "results" / "kv-tiers-live.md"
READING = Path(__file__).resolve().parent / "reading-live.md"  # copied in after the table
GPU = "H100"
WORKERS = 4
GPU_BLOCKS = 2560  # per worker, 16-token blocks: 40K tokens, five 8K prefixes
OFFLOAD_GIB = 8  # per worker: 4,096 blocks of 2 MiB (Llama-3.1-8B's 128 KiB per token)
EVENTS = ["--tokenizer", "emulator", "--kv-events-port", "5557"]
PRICED = ["--cpu-tier-gpu", GPU, "--cpu-tier-model", MODEL_8B, "--cpu-tier-tp", "1"]


@dataclass(frozen=True)
class Arm:
    label: str
    offload: bool
    router: tuple[str, ...]


ARMS = (
    Arm("no offload", False, ()),
    Arm("offload, GPU-only scoring", True, ()),
    Arm("offload, llm-d rule (0.4)", True, ("--cpu-tier-weight", "0.4")),
    Arm("offload, priced", True, tuple(PRICED)),
)


def groups(quick: bool) -> tuple[list[Any], list[Any]]:
    """llm-d's shape scaled down: (warm-up requests, measured requests)."""
    n = -(-int(1.32 * WORKERS * GPU_BLOCKS * 16) // 8192)
    reqs, warm_end = shapes.Groups(8.0, 10.0 if quick else 20.0, n, 8192, 128, 8).trace()
    return [r for r in reqs if r.arrival < warm_end], [r for r in reqs if r.arrival >= warm_end]


def private(quick: bool) -> tuple[list[Any], list[Any]]:
    reqs = shapes.Private(3.0, 10.0 if quick else 20.0, 16_384, 0.5, 10.0, 128, 8).trace()
    return [], reqs


SHAPES = (("llm-d prefix groups (8K, 1.32x GPU KV)", groups), ("16K private prefixes", private))


def measure(logdir: Path, arm: Arm, warm: list[Any], load: list[Any]) -> dict[str, Any]:
    procs = Procs(logdir)
    try:
        extra = ("--kv-offloading-size", str(OFFLOAD_GIB), "--kv-offloading-backend", "native") if arm.offload else ()
        workers = _emulators(
            procs, [("worker", f"node-{i}") for i in range(WORKERS)], MODEL_8B, GPU, GPU_BLOCKS, 1.0, 1, extra
        )
        urls = [e.url for _, e in workers]
        port = free_port("127.0.0.1")
        cmd = router_command("xpyd", port, [], urls, [*EVENTS, *arm.router])
        router = procs.spawn("router", f"http://127.0.0.1:{port}", cmd)
        wait_http(router.url, "/health", 60, router)
        if warm:
            bodies, arrivals = _bodies(warm, shapes.BLOCK_TOKENS, 1.0)
            _replay(router.url, [b | {"model": MODEL_8B} for b in bodies], arrivals)
            time.sleep(0.5)
        before = _tiers_raw(urls)
        bodies, arrivals = _bodies(load, shapes.BLOCK_TOKENS, 1.0)
        results = _replay(router.url, [b | {"model": MODEL_8B} for b in bodies], arrivals)
        after = _tiers_raw(urls)
        ok = [r for r in results if r[2]]
        ttft = [r[0] for r in ok]
        queries = (after[0] - before[0]) or 1.0
        return {
            "ok": len(ok),
            "n": len(results),
            "ttft_mean_s": sum(ttft) / len(ttft) if ttft else float("nan"),
            "ttft_p90_s": pct(ttft, 0.9),
            "gpu_hit": (after[1] - before[1]) / queries,
            "cpu_hit": (after[2] - before[2]) / queries,
        }
    except (RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
        return {"error": scrub(str(exc)[-300:])}
    finally:
        procs.stop_all()


def _tiers_raw(urls: list[str]) -> tuple[float, float, float]:
    """Prompt tokens queried, GPU hits and CPU-tier reloads over every worker, so far."""
    stats = [scrape(u) for u in urls]
    return (
        sum(s.get("vllm:prefix_cache_queries_total", 0.0) for s in stats),
        sum(s.get("vllm:prefix_cache_hits_total", 0.0) for s in stats),
        sum(s.get("xpyd_emulator_cpu_tier_hits_total", 0.0) for s in stats),
    )


def run(quick: bool, log: Any) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kv-tiers-live-") as tmp:
        for shape, build in SHAPES:
            warm, load = build(quick)
            for arm in ARMS:
                row = {"shape": shape, "arm": arm.label, "requests": len(load)} | measure(Path(tmp), arm, warm, load)
                log(f"{shape} / {arm.label}: {row}")
                rows.append(row)
    return rows


def _s(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.3f}"


def render(rows: list[dict[str, Any]], header: str, reading: str = "") -> str:
    out = [
        header,
        "",
        f"{WORKERS} co-located emulated vLLM workers (`xpyd emulate`, {MODEL_8B} on {GPU}, real time: speedup 1,"
        f" {GPU_BLOCKS:,} GPU KV blocks of 16 tokens each; with offload `--kv-offloading-size {OFFLOAD_GIB}"
        " --kv-offloading-backend native`, reloads at 80% of the H100's 64 GB/s host link) on 127.0.x.x behind"
        " `xpyd router --worker ... --tokenizer emulator --kv-events-port 5557` (kv-aware, default scorers"
        " `tiers,recent,rendezvous`). Shapes: llm-d's prefix groups scaled down (8K-token prefixes,"
        " ~128-token questions, 8 output tokens, a working set 1.32x the workers' GPU KV, 8 QPS Poisson; every"
        " group asked once first, not measured) and 16K-token private prefixes (3 QPS, half asked a second time"
        " 2.5-17.5 s later). Arms: no offload; offload with GPU-only scoring (no tier flags); offload with"
        " llm-d's rule (`--cpu-tier-weight 0.4`); offload priced (`--cpu-tier-gpu H100 --cpu-tier-model ...`)."
        " Hits: the workers' counters over the measured requests, prompt tokens found on the GPU"
        " (`vllm:prefix_cache_hits_total`) and loaded from the CPU tier (`xpyd_emulator_cpu_tier_hits_total`)"
        " over prompt tokens queried.",
        "",
        "| shape | arm | requests ok | TTFT mean s | TTFT p90 s | GPU hit | CPU hit | TTFT mean vs no offload |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = next(r for r in rows if r["shape"] == row["shape"] and r["arm"] == ARMS[0].label)
        if "error" in row:
            out.append(f"| {row['shape']} | {row['arm']} | error: {row['error']} | | | | | |")
            continue
        vs = f"{row['ttft_mean_s'] / base['ttft_mean_s']:.2f}x" if base.get("ttft_mean_s") else "-"
        out.append(
            f"| {row['shape']} | {row['arm']} | {row['ok']}/{row['n']} | {_s(row['ttft_mean_s'])}"
            f" | {_s(row['ttft_p90_s'])} | {row['gpu_hit']:.1%} | {row['cpu_hit']:.1%} | {vs} |"
        )
    if reading:
        out += ["", reading.rstrip("\n")]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter runs (a smoke run)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    wall = time.perf_counter()
    rows = run(args.quick, lambda msg: print(msg, file=sys.stderr, flush=True))
    header = (
        "# KV tiers live: emulated workers with a CPU KV tier behind the real router (scaled down)\n\n"
        f"Measured {when} on {machine} (the 2 cores shared with others) by `.venv/bin/python bench/tiers/live.py"
        f"{' --quick' if args.quick else ''}` ({time.perf_counter() - wall:.0f} s wall). One run, one seed; on a"
        " shared 2-core machine the emulators' timing is noisy, so small differences between arms are noise."
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    reading = READING.read_text(encoding="utf-8") if READING.is_file() and not args.quick else ""
    args.out.write_text(render(rows, header, reading))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
