"""Copy the generated CRDs into the chart (Helm cannot read outside it) and report stale copies."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from xpyd_chart.helm import CHART, REPO

SOURCE_CRDS = REPO / "crds"
CHART_CRDS = CHART / "files" / "crds"


def stale_crds(source: Path = SOURCE_CRDS, copy: Path = CHART_CRDS) -> list[str]:
    """Names of CRD files missing from, extra in, or different in the chart's copy."""
    want = {p.name: p.read_bytes() for p in sorted(source.glob("*.yaml"))}
    have = {p.name: p.read_bytes() for p in sorted(copy.glob("*.yaml"))}
    return sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))


def sync_crds(source: Path = SOURCE_CRDS, copy: Path = CHART_CRDS) -> list[str]:
    """Make the chart's copy equal crds/ byte for byte; returns the names it changed."""
    changed = stale_crds(source, copy)
    copy.mkdir(parents=True, exist_ok=True)
    for name in changed:
        if (source / name).is_file():
            shutil.copyfile(source / name, copy / name)
        else:
            (copy / name).unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    """`python -m xpyd_chart [--check]`: sync (or check) the chart's CRDs and dashboards."""
    from xpyd_dashboards.cli import main as dashboards_main

    parser = argparse.ArgumentParser(prog="python -m xpyd_chart", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the chart's copies are stale")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale_crds()
        for name in bad:
            print(f"stale: {CHART_CRDS / name} (run: python -m xpyd_chart)", file=sys.stderr)
        return 1 if bad or dashboards_main(["--check"]) else 0
    for name in sync_crds():
        print(f"synced {CHART_CRDS / name}")
    return dashboards_main([])
