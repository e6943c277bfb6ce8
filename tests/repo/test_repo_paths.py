"""A fresh clone holds everything its commands read: no default path leaves the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Paths that only exist on some machine: a user's clone has none of them.
MACHINE_PATH = re.compile(r"(?:^|[^\w.~/-])(/(?:work|root|home|Users|mnt|srv|tmp)/[\w.-]+)")
RELATIVE_UP = re.compile(r"(?:\.\./)+[\w.-]+")
PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")
BINARY_SUFFIXES = {".png", ".jsonl", ".csv", ".sum", ".tgz", ".gz"}


def repo_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    files = [ROOT / line for line in out.splitlines() if line]
    return [f for f in files if f.is_file() and f.suffix not in BINARY_SUFFIXES]


def text_of(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return ""


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def outside_paths(rel: Path, text: str) -> list[str]:
    """Every path in a file's text that points outside the repository, whichever folder it is read from."""
    found = [m.group(1) for m in MACHINE_PATH.finditer(text)]
    for m in RELATIVE_UP.finditer(text):
        # a document's links are relative to its folder; commands and code run from the repository root
        base = (ROOT / rel).parent if rel.suffix == ".md" else ROOT
        if not inside(base / m.group(0)):
            found.append(m.group(0))
    depth = len(rel.parts) - 1  # parents[depth] is the repository root
    found += [m.group(0) for m in PARENTS.finditer(text) if int(m.group(1)) > depth]
    return found


def test_no_file_points_outside_the_repository() -> None:
    files = repo_files()
    assert len(files) > 100, "the file listing should cover the whole tree"
    offenders = {
        str(f.relative_to(ROOT)): hits
        for f in files
        if f.resolve() != Path(__file__).resolve() and (hits := outside_paths(f.relative_to(ROOT), text_of(f)))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        ("demo/run.sh", "TRACE=${DEMO_TRACE:-../outside/traces/x.jsonl}", ["../outside"]),
        ("demo/run.sh", "TRACE=${DEMO_TRACE:-data/traces/x.jsonl}", []),
        ("docs/install.md", "see [the README](../README.md)", []),
        ("docs/install.md", "see ../../elsewhere/notes.md", ["../../elsewhere"]),
        ("bench/sim/run.py", 'TRACES = Path("/srv/data/traces")', ["/srv/data"]),
        ("bench/sim/run.py", "ROOT = Path(__file__).resolve().parents[2]", []),
        ("bench/sim/run.py", "ROOT = Path(__file__).resolve().parents[3]", ["Path(__file__).resolve().parents[3]"]),
        ("Dockerfile", "COPY --from=build /opt/xpyd /opt/xpyd", []),
        ("docs/operate.md", "the pod mounts /dev/shm and reads /var/run/secrets/token", []),
        ("README.md", "cache in ~/.cache/xpyd or /srv/someone/.cache", ["/srv/someone"]),
        ("bench/README.md", "--plot /tmp/plots", ["/tmp/plots"]),
    ],
)
def test_outside_paths_finds_what_leaves_the_repo(rel: str, text: str, expected: list[str]) -> None:
    assert outside_paths(Path(rel), text) == expected


def test_traces_the_commands_read_are_in_the_repository() -> None:
    traces = ROOT / "data" / "traces"
    for name in ("conversation_trace.jsonl", "AzureLLMInferenceTrace_conv.csv"):
        assert (traces / name).stat().st_size > 100_000, name
    notes = (traces / "README.md").read_text()
    assert "Apache-2.0" in notes and "CC-BY-4.0" in notes
    assert "data/traces/conversation_trace.jsonl" in (ROOT / "demo" / "run.sh").read_text()
