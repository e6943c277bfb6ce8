"""One command for the router benchmarks; writes bench/results/router.md and router.json.

    .venv/bin/python bench/router/run.py [--quick]

Runs, in one go on this machine: the routing-decision microbenchmark, the HTTP stack comparison,
the proxy overhead against the PyPI peer routers, and the conversation-trace replay.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import decision  # type: ignore[import-not-found]
import overhead  # type: ignore[import-not-found]
import replay  # type: ignore[import-not-found]
import stacks  # type: ignore[import-not-found]

RESULTS = Path(__file__).resolve().parents[1] / "results"


def f(value: Any, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render(res: dict[str, Any]) -> str:
    out = [
        "# Router benchmarks", "",
        f"Measured {res['when']} on {res['machine']} by `.venv/bin/python bench/router/run.py`"
        f"{' --quick' if res['quick'] else ''} ({res['seconds']:.0f} s). Load generator, emulators and routers "
        "share the same 2 cores (other work was running too), so compare the ratios within one run.", "",
        "## Routing decision (128k-character prompt, 64 workers, ~1M indexed blocks)", "",
        "Block hashing of the whole prompt + the policy's full plan (prefill and decode choice).", "",
        "| policy | wall p50 us | wall p99 us | CPU p50 us | CPU p99 us |", "|---|---|---|---|---|",
    ]  # fmt: skip
    dec = res["decision"]
    for name in ("kv-aware", "round-robin", "least-loaded", "llm-d", "sglang"):
        w, c = dec[name]["wall"], dec[name]["cpu"]
        out.append(f"| {name} | {w['p50_us']} | {w['p99_us']} | {c['p50_us']} | {c['p99_us']} |")
    out += ["", f"Indexed blocks: {dec['indexed_blocks']:,}; hashing alone: {dec['hash_only_mean_us']} us.", ""]
    st = res["stacks"]
    out += ["## HTTP stack (CPU microseconds per request on loopback)", "", "| component | CPU us/req |", "|---|---|"]
    out += [f"| client: {k} | {v} |" for k, v in st["client_cpu_us"].items()]
    out += [f"| server: {k} | {v} |" for k, v in st["server_cpu_us"].items()]
    out += ["", "## Proxy overhead (concurrency 64, zero-delay emulators, 1 prefill + 1 decode)", ""]
    out += ["All routers run the two-hop prefill/decode path; `direct` calls the decode worker in one hop.", ""]
    out += ["| target | stream | ok/n | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | router CPU us/req |"]
    out += ["|---|---|---|---|---|---|---|---|---|"]
    base = {r["stream"]: r for r in res["overhead"] if r.get("router", "").startswith("direct")}
    for r in res["overhead"]:
        if "error" in r:
            out.append(f"| {r['router']} | - | failed: {r['error'][:120]} | | | | | | |")
            continue
        b = base[r["stream"]]
        out.append(
            f"| {r['router']} | {'yes' if r['stream'] else 'no'} | {r['ok']}/{r['n']} | {f(r['p50_ms'])} | "
            f"{f(r['p99_ms'])} | {f(r['p50_ms'] - b['p50_ms'])} | {f(r['p99_ms'] - b['p99_ms'])} | "
            f"{f(r['rps'], 0)} | {f(r['cpu_us_per_req'], 0)} |"
        )
    rp = res["replay"]
    out += [
        "", f"## Trace replay (first {rp['n']} requests of conversation_trace.jsonl, {rp['speed']:g}x speed)", "",
        "4 prefill + 2 decode emulated Llama-3.1-70B workers (TP4 on B200, timings run "
        f"{rp['speed']:g}x faster than modelled), each hash id a deterministic 512-token text block, "
        f"streamed with output capped at {replay.MAX_OUTPUT} tokens. Hit ratio is measured by the prefill "
        f"workers; an infinite cache would allow {rp['infinite_cache_hit_ratio']:.2%}.", "",
        "| policy | ok/n | TTFT p50 ms | TTFT p99 ms | prefix hit | of infinite | prefill max/mean | decode max/mean |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rp["runs"]:
        if "error" in r:
            out.append(f"| {r['policy']} | failed: {r['error'][:150]} | | | | | | |")
            continue
        out.append(
            f"| {r['policy']} | {r['ok']}/{r['n']} | {f(r['ttft_p50_ms'])} | {f(r['ttft_p99_ms'])} | "
            f"{r['prefix_hit_ratio']:.2%} | {r['prefix_hit_ratio'] / rp['infinite_cache_hit_ratio']:.0%} | "
            f"{f(r['prefill_imbalance'], 2)} | {f(r['decode_imbalance'], 2)} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    start = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="xpyd-router-bench-"))
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
    }  # fmt: skip
    print("decision microbenchmark...", file=sys.stderr, flush=True)
    res["decision"] = decision.run(500 if args.quick else 2000)
    print("HTTP stacks...", file=sys.stderr, flush=True)
    res["stacks"] = stacks.run(logs, 500 if args.quick else 2000)
    print("proxy overhead...", file=sys.stderr, flush=True)
    res["overhead"] = overhead.run(logs, 300 if args.quick else 1500)
    print("trace replay...", file=sys.stderr, flush=True)
    res["replay"] = replay.run(logs, 60 if args.quick else 300, 10.0)
    res["seconds"] = time.monotonic() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router.json").write_text(json.dumps(res, indent=1))
    (args.out / "router.md").write_text(render(res))
    print(render(res))
    print(f"logs in {logs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
