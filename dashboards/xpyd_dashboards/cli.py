"""Write the generated dashboards to disk, or check that the committed copies are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xpyd_dashboards.build import render
from xpyd_dashboards.panels import DASHBOARDS

REPO = Path(__file__).resolve().parents[2]
# The JSON lives in dashboards/ for people and in the chart for Helm (which cannot read outside it).
TARGETS = (REPO / "dashboards", REPO / "charts" / "xpyd-operator" / "dashboards")


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{spec.name}.json": render(spec) for spec in DASHBOARDS}


def stale(targets: tuple[Path, ...] = TARGETS) -> list[Path]:
    """Committed dashboard files that are missing or differ from what the code generates."""
    files = rendered()
    out: list[Path] = []
    for folder in targets:
        for name, text in files.items():
            path = folder / name
            if not path.is_file() or path.read_text() != text:
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m xpyd_dashboards [--check]`."""
    parser = argparse.ArgumentParser(prog="python -m xpyd_dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is stale")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"stale: {path} (run: python -m xpyd_dashboards)", file=sys.stderr)
        return 1 if bad else 0
    for folder in TARGETS:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in rendered().items():
            (folder / name).write_text(text)
            print(f"wrote {folder / name}")
    return 0
