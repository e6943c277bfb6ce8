"""Writes the demo's SLO results: each load phase's summary line (`xpyd load`'s last line, key=value pairs) as a table.

    python demo/results.py --manifest examples/demo/hgx-b200-emulated.yaml --out FILE "Phase 1: ..."=phase1.txt ...
    python demo/results.py --manifest examples/demo/hgx-b200-emulated.yaml --print-slo   # "TTFT ITL GOAL"

The SLO is the manifest's spec.slo, so the clients are judged by what the deployment states.

The demo writes it to $XPYD_CACHE (never a tracked file); DEMO_RESULTS=bench/results/demo-slo.md refreshes the
committed one the README quotes.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import yaml

FIELDS = ("requests", "ok", "errors", "ttft_p50_s", "ttft_p99_s", "slo_attainment")


def summary(path: Path) -> dict[str, str]:
    """The key=value pairs of the file's last non-empty line; ValueError naming the file when it has none."""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if "=" in ln]
    if not lines:
        raise ValueError(f"{path}: no `xpyd load` summary line")
    return dict(pair.split("=", 1) for pair in lines[-1].split() if "=" in pair)


def stated_slo(manifest: Path) -> tuple[float, float, float, int]:
    """TTFT and ITL targets, the attainment goal and the percentile of the manifest's spec.slo (the API's defaults:
    0.99 and p95)."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d and d.get("kind") == "DisaggregatedDeployment"]
    slo = next((d["spec"]["slo"] for d in docs if (d.get("spec") or {}).get("slo")), None)
    if slo is None:
        raise ValueError(f"{manifest}: no DisaggregatedDeployment states spec.slo")
    return (float(slo["ttftSeconds"]), float(slo["itlSeconds"]), float(slo.get("attainment", 0.99)),
            int(slo.get("percentile", 95)))  # fmt: skip


def render(phases: list[tuple[str, dict[str, str]]], ttft: float, itl: float, goal: float, percentile: int) -> str:
    rows = []
    for name, got in phases:
        attained = got.get("slo_attainment", "None")
        meets = "yes" if attained not in ("None", "") and float(attained) >= goal else "no"
        cells = [got.get(f, "-") for f in FIELDS[:-1]]
        pct = f"{float(attained) * 100:.1f}%" if attained not in ("None", "") else "-"
        rows.append(f"| {name} | {' | '.join(cells)} | {pct} | {meets} |")
    return (
        "# The demo's SLO, as its clients saw it\n\n"
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} by `make demo` "
        "(`DEMO_RESULTS=bench/results/demo-slo.md` to refresh this file). The demo's deployment "
        "(`examples/demo/hgx-b200-emulated.yaml`) states `spec.slo`: "
        f"TTFT {ttft:g} s and ITL {itl * 1000:g} ms at p{percentile} "
        f"for {goal * 100:g}% of requests; its pools start at 1 prefill and 1 decode replica. A request meets the SLO "
        f"when it succeeds with TTFT <= {ttft:g} s and a mean inter-token time <= {itl * 1000:g} ms (`xpyd load "
        "--slo-ttft --slo-itl`); attainment is the share that do.\n\n"
        "| phase | requests | ok | errors | TTFT p50 s | TTFT p99 s | SLO attainment | meets the goal |\n"
        "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--manifest", required=True, type=Path, help="the demo's DisaggregatedDeployment")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--print-slo", action="store_true", help='print "TTFT ITL GOAL" of spec.slo and stop')
    parser.add_argument("phases", nargs="*", metavar="NAME=FILE")
    args = parser.parse_args(argv)
    try:
        ttft, itl, goal, percentile = stated_slo(args.manifest)
        if args.print_slo:
            print(f"{ttft:g} {itl:g} {goal:g}")
            return 0
        if args.out is None or not args.phases:
            raise ValueError("--out and at least one NAME=FILE are needed")
        phases = [(name, summary(Path(file))) for name, _, file in (p.rpartition("=") for p in args.phases)]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        print(f"demo/results.py: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(phases, ttft, itl, goal, percentile))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
