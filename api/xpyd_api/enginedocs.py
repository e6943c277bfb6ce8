"""Keeps docs/engines.md's tables equal to the engine profiles.

Run `python -m xpyd_api.enginedocs` to rewrite them; `--check` exits 1 when the committed page is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from xpyd_api import engines

PAGE: Final = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
# marker name -> the generator of the table between `<!-- name: ... -->` and `<!-- /name -->`
TABLES: Final[dict[str, Callable[[], str]]] = {
    "engine-matrix": engines.support_matrix,
    "engine-metrics": engines.metrics_table,
}


def _filler(table: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m[1] + table + m[3]


def render(text: str) -> str:
    """`text` with every generated table replaced by the profiles' current one; ValueError on a missing marker."""
    for name, make in TABLES.items():
        block = re.compile(rf"(<!-- {name}:[^\n]*-->\n)(.*?)(<!-- /{name} -->)", re.DOTALL)
        if not block.search(text):
            raise ValueError(f"docs/engines.md has no <!-- {name}: ... --> ... <!-- /{name} --> block")
        text = block.sub(_filler(make()), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpyd_api.enginedocs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/engines.md is stale")
    args = parser.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if wanted != current:
            print("docs/engines.md is stale: run python -m xpyd_api.enginedocs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted, encoding="utf-8")
    print("wrote docs/engines.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
