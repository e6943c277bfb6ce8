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


# --- `make demo` writes nothing into the clone -------------------------------------------------------

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Z_]+)=(\S+)", re.M)
_WRITE = re.compile(r"""(?:--out\s+|\btee\s+(?:-a\s+)?|\bmkdir\s+(?:-p\s+)?|(?<![\d&>=-])>>?\s*)"?([^\s"'&;|)]+)""")


def _default(value: str) -> str:
    """`${DEMO_PLOT:-$XPYD_CACHE/x.png}` -> `$XPYD_CACHE/x.png`: what a variable is when no knob is set."""
    m = re.fullmatch(r"\$\{(\w+):-(.*)\}", value)
    return m[2] if m else value


def writes_into_the_tree(script: str) -> list[str]:
    """What the script writes (`--out`, `tee`, `mkdir`, `>`), by default, anywhere but under $XPYD_CACHE, a
    `mktemp` folder or /dev/null."""
    variables = {name: _default(value) for name, value in _ASSIGN.findall(script) if name != "XPYD_CACHE"}
    out: list[str] = []
    for target in _WRITE.findall(script):
        m = re.match(r"\$\{?(\w+)\}?(.*)", target)
        path = variables.get(m[1], f"${m[1]}") + m[2] if m else target
        if not (path.startswith(("$XPYD_CACHE/", "$(mktemp")) or path == "/dev/null"):
            out.append(f"{target} -> {path}")
    return out


def test_demo_writes_only_under_the_cache() -> None:
    """demo/run.sh's outputs (the plot, the SLO results, the phases' logs) default to $XPYD_CACHE or a
    temporary folder, never a path in the clone (.ci/run checks the clone after `make demo` too)."""
    demo = (ROOT / "demo" / "run.sh").read_text()
    variables = {name: _default(value) for name, value in _ASSIGN.findall(demo)}
    assert variables["XPYD_CACHE"].startswith("$HOME/"), "the cache lies outside the clone"
    assert variables["PLOT"] == "$XPYD_CACHE/demo-autoscaling.png" and "${DEMO_PLOT:-" in demo
    assert variables["RESULTS"] == "$XPYD_CACHE/demo-slo.md" and "${DEMO_RESULTS:-" in demo
    written = set(_WRITE.findall(demo))
    assert {"$PLOT", "$RESULTS", "$PHASES/phase1.txt"} <= written, written
    assert writes_into_the_tree(demo) == []
    for script in ("plot.py", "results.py"):  # their --out has no default to fall back on
        line = next(x for x in (ROOT / "demo" / script).read_text().splitlines() if '"--out"' in x)
        assert "default=" not in line, line


def test_a_demo_output_in_the_tree_is_reported() -> None:
    script = (
        "export XPYD_CACHE=${XPYD_CACHE:-$HOME/.cache/xpyd}\nPLOT=${DEMO_PLOT:-docs/images/demo.png}\n"
        'TMP=$(mktemp -d)\npython demo/plot.py --out "$PLOT"\nxpyd load | tee "$TMP/a.txt" >/dev/null 2>&1\n'
        'echo x > bench/results/demo.md\necho y >&2\nmkdir -p "$XPYD_CACHE/logs"\n'
    )
    assert writes_into_the_tree(script) == [
        "$PLOT -> docs/images/demo.png",
        "bench/results/demo.md -> bench/results/demo.md",
    ]
    assert writes_into_the_tree(script.replace("docs/images/demo.png", "$XPYD_CACHE/demo.png")) == [
        "bench/results/demo.md -> bench/results/demo.md"
    ]


def test_ci_fails_when_the_demo_changes_the_clone() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines() if not line.strip().startswith("#")]
    demo, down = lines.index("make demo"), lines.index("make demo-down")
    checks = [i for i, line in enumerate(lines) if "git status --porcelain" in line]
    assert checks, "the clone is compared before and after the demo"
    before = [i for i, line in enumerate(lines) if line.startswith("tree_before=")]
    after = [i for i, line in enumerate(lines) if line.startswith("tree_after=")]
    assert before and after and before[0] < demo < down < after[0]
    assert "exit 1" in ci.split("tree_after=", 1)[1].split("make test", 1)[0]
