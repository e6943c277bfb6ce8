"""One command: routing to data-parallel ranks vs vLLM's own rank balancing; writes bench/results/dp-ranks.md.

    .venv/bin/python bench/dp/run.py [--quick] [--out FILE]

Simulates DeepSeek-R1 wide-EP deployments (HGX-B200 and GB200-NVL72) on the Mooncake conversation trace
and the synthetic chat and agent shapes, each in both modes over the same requests (bench/dp/suite.py).
About 75 s on the shared 2-core machine; --quick (a 3,000-request trace prefix, 120 s of synthetic load,
one seed) in about 10 s.
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

from bench.dp import report, suite  # noqa: E402

OUT = ROOT / "bench" / "results" / "dp-ranks.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests and one seed (a smoke run)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    seeds = suite.SEEDS[:1] if args.quick else suite.SEEDS
    res = suite.run(seeds=seeds, quick=args.quick, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    header = (
        "# Routing to data-parallel ranks vs the engine's rank balancing (simulated)\n\n"
        f"Measured {when} on {machine} by `.venv/bin/python bench/dp/run.py{' --quick' if args.quick else ''}`"
        f" ({res['wall_s']:.0f} s wall, {res['cpu_s']:.0f} CPU-s). Numbers from one run; the machine's cores are"
        " shared."
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.render(res, header))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
