"""The `xpyd` CLI from its wheel: built from this tree, installed with pip into a fresh venv, no clone needed.

What a user without the repository gets (README.md, below its command table): `xpyd --help` lists every
command, the commands the docs use (`plan`, `render`, `simulate`) work from any folder, with the model
catalog, the CRD and the chart's data inside the wheel, and a bad argument is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from xpyd_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-hgx-b200.yaml"
TRACE = ROOT / "data" / "traces" / "conversation_trace.jsonl"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(argv: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if check:
        assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def xpyd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `xpyd` script of a fresh venv holding only the wheel and its dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(ROOT)], cwd=work)
    wheels = sorted((work / "dist").glob("xpyd-*.whl"))
    assert len(wheels) == 1, wheels
    venv.create(work / "venv", with_pip=True)
    pip = work / "venv" / "bin" / "pip"
    run([str(pip), "install", "-q", "--disable-pip-version-check", str(wheels[0])], cwd=work)
    return work / "venv" / "bin" / "xpyd"


def test_the_wheel_holds_no_test_or_repo_only_file(xpyd: Path) -> None:
    site = next((xpyd.parent.parent / "lib").glob("python3*/site-packages"))
    installed = {p.name for p in site.iterdir()}
    assert {"xpyd_cli", "xpyd_api", "xpyd_operator", "xpyd_router", "xpyd_perf"} <= installed, installed
    assert not {"tests", "e2e", "bench"} & installed, installed


def test_help_lists_every_command(xpyd: Path, tmp_path: Path) -> None:
    done = run([str(xpyd), "--help"], cwd=tmp_path)
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ") and line.strip()}
    assert set(COMMANDS) <= listed, done.stdout


def test_plan_render_and_simulate_work_outside_the_clone(xpyd: Path, tmp_path: Path) -> None:
    plan = run([str(xpyd), "plan", "--model", "llama-3.1-70b", "--topology", "HGX-B200"], cwd=tmp_path)
    assert "suggested for" in plan.stdout, plan.stdout
    rendered = run([str(xpyd), "render", str(EXAMPLE)], cwd=tmp_path)
    assert "kind: StatefulSet" in rendered.stdout and "kind: Deployment" in rendered.stdout, rendered.stdout[:2000]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(TRACE.read_text().splitlines(keepends=True)[:40]))
    simulated = run([str(xpyd), "simulate", "--spec", str(EXAMPLE), "--trace", str(trace), "--json"], cwd=tmp_path)
    assert json.loads(simulated.stdout), simulated.stdout[:2000]


def test_a_bad_argument_is_one_line_and_exit_2(xpyd: Path, tmp_path: Path) -> None:
    done = run([str(xpyd), "plan", "--model", "no-such-model"], cwd=tmp_path, check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
