"""The harness folders import in one direction: tests, e2e and bench may use testkit; bench and e2e never
import each other, and testkit imports none of them (lint-imports covers the installed packages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "bench": {"e2e", "tests"},
    "e2e": {"bench", "tests"},
    "testkit": {"bench", "e2e", "tests"},
}


def imported_roots(source: str) -> set[str]:
    """The top-level package of every absolute import in a module's source."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize(
    ("source", "roots"),
    [
        ("import e2e.kube\nfrom bench.reliability import run", {"e2e", "bench"}),
        ("from . import kube\nfrom .operator_fixtures import Kube", set()),  # relative: inside the folder
        ("import os, testkit.outcomes as o", {"os", "testkit"}),
        ("def f():\n    from e2e import kube", {"e2e"}),  # an import inside a function counts too
    ],
)
def test_imported_roots(source: str, roots: set[str]) -> None:
    assert imported_roots(source) == roots


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_a_harness_folder_imports_none_of_the_folders_above_it(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder}/ holds no Python files"
    wrong = {
        str(f.relative_to(ROOT)): sorted(bad)
        for f in files
        if (bad := imported_roots(f.read_text()) & FORBIDDEN[folder])
    }
    assert wrong == {}
