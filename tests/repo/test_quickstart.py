"""The README's quick start is the two commands CI runs: `make demo` then `make test`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has a sh code block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_exactly_two_commands() -> None:
    assert quick_start_commands() == ["make demo", "make test"]


def test_ci_runs_both_readme_commands_in_order() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines() if not line.strip().startswith("#")]
    demo = next(i for i, line in enumerate(lines) if line.endswith("make demo"))
    down = lines.index("make demo-down")
    test = lines.index("make test")
    assert demo < down < test


def test_demo_checks_scale_up_and_down() -> None:
    demo = (ROOT / "demo" / "run.sh").read_text()
    assert "demo/verify.py" in demo and "wait_shrunk" in demo
