"""One command: the KV-tier benchmark (CPU KV offloading, simulated); writes bench/results/kv-tiers.md.

    .venv/bin/python bench/tiers/run.py [--quick] [--out FILE]

llm-d's published measurement rebuilt in the simulator (gpt-oss-120b, 8 prefill TP1 + 2 decode TP4 on
H200, 16K-token prefix groups, a working set 1.32x the GPU KV, 5-40 QPS), long private prefixes and
multi-turn chat, each under four arms: GPU only, a CPU tier the router does not price, one it counts
at llm-d's fixed weight (0.4) and one it prices (bench/tiers/suite.py). About a minute on the shared
2-core machine; --quick (shorter runs) in about half that. The reading of the results is kept in
bench/tiers/reading.md and copied in.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tiers import report, suite  # noqa: E402

OUT = ROOT / "bench" / "results" / "kv-tiers.md"
READING = Path(__file__).resolve().parent / "reading.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter runs (a smoke run)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    res = suite.run(quick=args.quick, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    header = (
        "# KV tiers: a CPU KV tier (offloading) with and without the router's pricing (simulated)\n\n"
        f"Measured {when} on {machine} (the 2 cores shared with others) by `.venv/bin/python bench/tiers/run.py"
        f"{' --quick' if args.quick else ''}` ({res['wall_s']:.0f} s wall, {res['cpu_s']:.0f} CPU-s)."
        " Numbers from one run, one seed; ratios are between arms of the same run."
    )
    reading = READING.read_text(encoding="utf-8") if READING.is_file() and not args.quick else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.render(res, header, reading))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
