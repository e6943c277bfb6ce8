"""docs/configure.md's network profile table says what xpyd_api.fabrics gives each profile's pods."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xpyd_api import fabrics

REPO = Path(__file__).resolve().parents[2]
CONFIGURE = (REPO / "docs" / "configure.md").read_text()


def rows() -> list[list[str]]:
    lines = CONFIGURE.split("<!-- network-profiles", 1)[1].splitlines()[1:]
    table = lines[: next(i for i, s in enumerate(lines) if not s.startswith("|"))]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in table[2:]]


def codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def test_every_profile_has_a_row() -> None:
    assert [codes(r[0])[0] for r in rows()] == list(fabrics.PROFILES)


@pytest.mark.parametrize("row", rows(), ids=lambda r: r[0].strip("`"))
def test_row_matches_the_profile(row: list[str]) -> None:
    name, _, resources, env, caps = row
    parts = fabrics.PROFILES[codes(name)[0]].parts(gpus=8)
    documented = [c.split(":")[0].split("<")[0] for c in codes(resources) if "/" in c]
    known = [*parts.resources, *parts.annotations]
    assert all(any(r.startswith(d) for r in known) for d in documented), (documented, known)
    assert bool(documented) == bool(parts.resources)
    named = [c.split("=")[0] for c in codes(env) if c.isupper() or "=" in c]
    assert set(named) <= set(parts.env), named
    assert codes(caps) == list(parts.capabilities)
