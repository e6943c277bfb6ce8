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


def run(logdir: Path, quick: bool = False, rounds: int = 9) -> dict[str, Any]:
    n = 300 if quick else 2000
    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {}  # path -> xpyd / reference, one per round: both measured in that round
    for i in range(1 if quick else rounds):
        got = overhead.run(logdir, n=n, only=ROUTERS, paths=PATHS, rotate=i)
        rows += got
        mine = {_key(r): r["cpu_us_per_req"] for r in got if _kept(r) and r["router"] == "xpyd kv-aware"}
        ref = {_key(r): r["cpu_us_per_req"] for r in got if _kept(r) and r["router"] == REFERENCE}
        for key, value in mine.items():
            if ref.get(key):
                ratios.setdefault(key, []).append(value / ref[key])
    samples: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if _kept(r):
            samples.setdefault(_key(r), {}).setdefault(r["router"], []).append(r["cpu_us_per_req"])
    medians = {k: {router: statistics.median(v) for router, v in d.items()} for k, d in samples.items()}
    return {
        "n": n,
        "rows": rows,
        "median_cpu_us": medians,
        "ratios": ratios,
        "median_ratio": {k: statistics.median(v) for k, v in ratios.items()},
    }


def _kept(r: dict[str, Any]) -> bool:
    return "error" not in r and not r["router"].startswith("direct") and "bootstrap" not in r["router"]


def _key(r: dict[str, Any]) -> str:
    return f"{r['path']}|{'streamed' if r['stream'] else 'plain'}"


def render(res: dict[str, Any], header: str) -> str:
    rounds = max((len(v) for v in res.get("ratios", {}).values()), default=1)
    out = [
        header,
        "",
        f"Each cell: the median over {rounds} rounds of router CPU microseconds per request ({res['n']} requests"
        " per round, concurrency 64, 16 tokens per answer, one zero-delay emulated worker per hop). Single pool:"
        " one co-located worker; two hops: prefill then decode (vLLM NixlConnector protocol). Every round runs"
        " every router on the same workers, one after the other, the order rotated each round; the ratio row"
        " divides xpyd's CPU by"
        f" {REFERENCE}'s in the same round (the machine's load drifts between rounds: one router's CPU per"
        " request varies by up to a third across rounds) and gives the median of those ratios.",
        "",
    ]
    keys = [f"{p}|{s}" for p in PATHS for s in ("plain", "streamed")]
    out += ["| router | " + " | ".join(k.replace("|", ", ") for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    med = res["median_cpu_us"]
    for router in ROUTERS:
        out.append(
            f"| {router} | " + " | ".join(f"{med.get(k, {}).get(router, float('nan')):.0f}" for k in keys) + " |"
        )
    ratio = res.get("median_ratio", {})
    each = res.get("ratios", {})
    out.append(
        f"| xpyd / {REFERENCE}, same round (median; each round) | "
        + " | ".join(
            f"**{ratio[k]:.2f}** ({', '.join(f'{x:.2f}' for x in each[k])})" if k in ratio else "-" for k in keys
        )
        + " |"
    )
    ok = [ratio[k] <= 1.0 for k in keys if k in ratio]
    out += ["", f"xpyd at or below {REFERENCE} (median same-round ratio <= 1) on {sum(ok)}/{len(ok)} paths."]
    return "\n".join(out) + "\n"
