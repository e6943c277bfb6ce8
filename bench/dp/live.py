"""Routing to data-parallel ranks, live: `xpyd router` in front of an emulated vLLM replica of 4 ranks.

    .venv/bin/python bench/dp/live.py [--seconds 30] [--out bench/results/dp-ranks-live.md]

The same slice of the cache suite's multi-turn chat shape (chat-20rps-small: shared system prompts,
caches half the working set) is replayed open-loop, streamed, through the router twice on fresh
emulators: `ranks` (`--data-parallel-size 4`: one target per rank, its KV events, the rank pinned
with X-data-parallel-rank) and `engine` (one target; the emulator's API server picks the rank by
vLLM's waiting x 4 + running rule, as vLLM < 0.14 does whatever the header says). The prefix hit ratio
is the emulator's own count (`vllm:prefix_cache_hits_total / queries`, summed over its ranks).
Bounded: two runs of `--seconds` of traffic (default 30) plus start-up, about 2 minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "router"))

from bench.cache import scenarios as sc  # noqa: E402
from bench.cache import workloads as wl  # noqa: E402
from bench.cache.live import EVENTS_PORT, MODEL_8B, WARM_S, _bodies, _emulators, _hit_ratio, _replay, _summary  # noqa: E402
from procs import Procs, free_port, router_command, wait_http  # type: ignore[import-not-found]  # noqa: E402

RANKS = 4
SCENARIO = "chat-20rps-small"
MODES = (("ranks", RANKS), ("engine", 1))  # (label, the router's --data-parallel-size)


def run(seconds: float, logdir: Path) -> list[dict[str, Any]]:
    s = next(x for x in sc.SCENARIOS if x.name == SCENARIO)
    reqs = [r for r in sc.load(s) if WARM_S <= r.arrival < WARM_S + seconds]
    bodies, arrivals = _bodies(reqs, sc.block_tokens(s), 1.0)
    for body in bodies:
        body["model"] = MODEL_8B
    ws = wl.working_set_tokens(reqs, sc.block_tokens(s))
    rank_blocks = int(ws * sc.SMALL / RANKS) // 16 + 2048  # as the suite sizes 4 workers: half the working set
    rows = []
    for label, size in MODES:
        procs = Procs(logdir)
        try:
            dp = ("--data-parallel-size", str(RANKS))
            [(_, worker)] = _emulators(procs, [("worker", "node-0")], MODEL_8B, "H100", rank_blocks, 1.0, args=dp)
            port = free_port("127.0.0.1")
            extra = ["--tokenizer", "emulator", "--kv-events-port", str(EVENTS_PORT), "--data-parallel-size", str(size)]
            router = procs.spawn(
                "router", f"http://127.0.0.1:{port}", router_command("xpyd", port, [], [worker.url], extra)
            )
            wait_http(router.url, "/health", 60, router)
            start = router.cpu()
            row = _summary(_replay(router.url, bodies, arrivals)) | {"prefix_hit_ratio": _hit_ratio([worker.url])}
            row["router_cpu_s"] = router.cpu() - start
        finally:
            procs.stop_all()
        rows.append({"mode": label, "requests": len(reqs), "rank_blocks": rank_blocks} | row)
        print(label, rows[-1], file=sys.stderr, flush=True)
    return rows


def render(rows: list[dict[str, Any]], seconds: float, wall: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    by = {r["mode"]: r for r in rows}
    lines = [
        "# Routing to data-parallel ranks, live (emulated vLLM replica of 4 ranks)",
        "",
        f"Measured {when} on {machine} by `.venv/bin/python bench/dp/live.py --seconds {seconds:g}` ({wall:.0f} s). "
        f"One run each; the machine's cores are shared. `{SCENARIO}`'s requests from second {WARM_S:g} for "
        f"{seconds:g} s, streamed, open-loop, through `xpyd router` (kv-aware, emulator tokens, KV events) to one "
        f"`xpyd emulate` vLLM replica of {RANKS} data-parallel ranks (Llama-3.1-8B on H100, "
        f"{rows[0]['rank_blocks']:,} blocks a rank: together half the slice's working set). `ranks`: one target "
        "per rank, pinned with X-data-parallel-rank; `engine`: one target, the API server's balancing (vLLM's "
        "waiting x 4 + running) picks the rank. Hit ratio from the emulator's counters.",
        "",
        "| mode | requests | ok | prefix hit | TTFT p50 s | TTFT p99 s | TTFT <= 2 s | router CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['requests']} | {r['ok']} | {r['prefix_hit_ratio']:.1%} | {r['ttft_p50_s']:.3f} | "
            f"{r['ttft_p99_s']:.3f} | {r['ttft_attainment']:.1%} | {r['router_cpu_s']:.1f} |"
        )
    if "ranks" in by and "engine" in by and by["engine"]["prefix_hit_ratio"]:
        ratio = by["ranks"]["prefix_hit_ratio"] / by["engine"]["prefix_hit_ratio"]
        lines += ["", f"Prefix hit ratio, ranks / engine: {ratio:.2f}x."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of the slice replayed in each mode")
    p.add_argument("--out", type=Path, help="also write the table, e.g. bench/results/dp-ranks-live.md")
    args = p.parse_args(argv)
    began = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(args.seconds, Path(tmp))
    table = render(rows, args.seconds, time.time() - began)
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
