"""One command for the cache-routing suite; writes bench/results/cache-*.md and cache.json.

    .venv/bin/python bench/cache/run.py [--only sim,cpu,live,live-replicas] [--quick]

The default runs sim, cpu and live (about 14 minutes on the shared 2-core machine); live-replicas
(about 6 minutes) runs when named in --only.

- sim: every scenario of bench/cache/scenarios.py under xpyd's policy and the peers' rules
  (simulated), and 1/2/4/8 router replicas on both shared traces (simulated);
- cpu: CPU per proxied request of xpyd vs sglang-router and vllm-router on zero-delay emulators,
  single pool and two hops, streamed and not (live, bench/router/overhead.py);
- live: a subset of the scenarios on emulated workers with the real routers (sglang-router and
  vllm-router from PyPI, `pip install -e '.[bench]'`);
- live-replicas: 1/2/4/8 xpyd router replicas behind a client that spreads requests, `xpyd load`'s
  replay of both shared traces.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "router"))

from bench.cache import report, scenarios, suite  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECTIONS = ("sim", "cpu", "live", "live-replicas")


def _header(title: str, res: dict[str, Any], what: str, dated: bool = True) -> str:
    when = f" {res['when']}" if dated else ""  # undated: each section says when it was measured
    return (
        f"# {title}\n\nMeasured{when} on {res['machine']} by `.venv/bin/python bench/cache/run.py"
        f"{' --quick' if res['quick'] else ''}` ({what}). Numbers from one run; the machine's 2 cores are shared."
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="sim,cpu,live", help=f"comma-separated sections of {SECTIONS}")
    p.add_argument("--quick", action="store_true", help="fewer requests everywhere (a smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="xpyd-cache-bench-"))
    res: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "quick": args.quick,
    }
    saved = args.out / "cache.json"
    old = json.loads(saved.read_text()) if saved.is_file() else {}
    ran = {"sim": ["sim"], "cpu": ["cpu"], "live": ["live"], "live-replicas": ["live_replicas"]}
    res["measured"] = old.get("measured", {}) | {key: res["when"] for s in only for key in ran[s]}
    start = time.monotonic()
    if "sim" in only:
        names = [s.name for s in scenarios.SCENARIOS][:3] if args.quick else None
        res["sim"] = suite.run(names)
        (args.out / "cache-suite.md").write_text(
            report.suite_md(
                res["sim"],
                _header(
                    "Cache-aware routing on every workload shape (simulated)", res, f"{res['sim']['seconds']:.0f} s"
                ),
            )
        )
        (args.out / "cache-replicas.md").write_text(
            report.replicas_md(
                res["sim"]["replicas"],
                _header("Router replicas (simulated)", res, "sim section")
                + "\n\n`xpyd simulate` with the kv-aware policy; requests spread over the replicas in turn"
                " (a Service). Before: each replica's index fed by its own routes, no shared load: each bounds a"
                " worker by the 1/N of its load it sees, and the sticky bound (2x the mean) lets a replica pile"
                " prefixes onto a worker the others also load. Own routes + sharing: a router without the engines'"
                " events (no tokenizer for them): the replicas, found in the pod watch, exchange their in-flight"
                f" counts and the routes they chose every {suite.PEER_SYNC_S * 1000:.0f} ms, each recording the"
                " others' routes in its index as it records its own (loadshare.py). KV events + sharing: every"
                " index fed by the workers' KV events (50 ms late) as well (the served model's tokenizer"
                " in-cluster, or --tokenizer).",
            )
        )
    if "cpu" in only:
        from bench.cache import cpu

        res["cpu"] = cpu.run(logs, quick=args.quick)
        (args.out / "cache-cpu.md").write_text(
            cpu.render(res["cpu"], _header("CPU per proxied request", res, "cpu section"))
        )
    if "live" in only or "live-replicas" in only:
        from bench.cache import live

        if "live" in only:
            res["live"] = live.run_peers(logs, quick=args.quick)
        if "live-replicas" in only:
            res["live_replicas"] = live.run_replicas(logs, quick=args.quick)
        merged = {**old, **res}
        (args.out / "cache-live.md").write_text(
            report.live_md(merged, _header("Live runs on emulated workers", res, "live sections", dated=False))
        )
    res["seconds"] = time.monotonic() - start
    saved.write_text(json.dumps({**old, **res}, indent=1, default=str))
    print(f"done in {res['seconds']:.0f} s; logs in {logs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
