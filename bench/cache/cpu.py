"""CPU per proxied request: xpyd against sglang-router and vllm-router, on both paths, streamed and not.

Runs bench/router/overhead.py (zero-delay emulators, closed loop at concurrency 64) several rounds
and keeps each router's median, since one round on a shared 2-core machine is noisy.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import overhead  # type: ignore[import-not-found]  # bench/router is on sys.path (bench/cache/run.py)

ROUTERS = ("xpyd kv-aware", "sglang-router cache_aware", "sglang-router round_robin", "vllm-router cache_aware")
PATHS = ("single-pool", "two-hop")
REFERENCE = "sglang-router cache_aware"


def run(logdir: Path, quick: bool = False, rounds: int = 3) -> dict[str, Any]:
    n = 300 if quick else 1500
    rows: list[dict[str, Any]] = []
    for _ in range(1 if quick else rounds):
        rows += overhead.run(logdir, n=n, only=ROUTERS, paths=PATHS)
    samples: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if "error" in r or r["router"].startswith("direct") or "bootstrap" in r["router"]:
            continue
        key = f"{r['path']}|{'streamed' if r['stream'] else 'plain'}"
        samples.setdefault(key, {}).setdefault(r["router"], []).append(r["cpu_us_per_req"])
    medians = {k: {router: statistics.median(v) for router, v in d.items()} for k, d in samples.items()}
    return {"n": n, "rows": rows, "median_cpu_us": medians}


def render(res: dict[str, Any], header: str) -> str:
    out = [
        header,
        "",
        f"Each cell: the median over rounds of router CPU microseconds per request ({res['n']} requests"
        " per round, concurrency 64, 16 tokens per answer, one zero-delay emulated worker per hop). Single pool:"
        " one co-located worker; two hops: prefill then decode (vLLM NixlConnector protocol).",
        "",
    ]
    keys = [f"{p}|{s}" for p in PATHS for s in ("plain", "streamed")]
    out += ["| router | " + " | ".join(k.replace("|", ", ") for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    med = res["median_cpu_us"]
    for router in ROUTERS:
        out.append(
            f"| {router} | " + " | ".join(f"{med.get(k, {}).get(router, float('nan')):.0f}" for k in keys) + " |"
        )
    ok = [med[k]["xpyd kv-aware"] <= med[k][REFERENCE] for k in keys if k in med and REFERENCE in med[k]]
    out += ["", f"xpyd at or below {REFERENCE} on {sum(ok)}/{len(ok)} paths."]
    return "\n".join(out) + "\n"
