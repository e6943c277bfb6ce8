"""helm lint, the strict values schema, and the rule that every values.yaml key is commented."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_chart.helm import CHART, KUBE_VERSION, PROMETHEUS_OPERATOR_API, run, set_args

pytestmark = pytest.mark.usefixtures("helm")

VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"


@pytest.mark.parametrize(
    "values",
    [{}, {"operator.watchNamespace": "team-a"}, {"crds.install": "false", "dashboards.enabled": "false"}],
)
def test_helm_lint_strict(values: dict[str, str]) -> None:
    result = run("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"foo": "1"}, "additional properties 'foo' not allowed"),
        ({"operator.debug": "true"}, "additional properties 'debug' not allowed"),
        ({"operator.logLevel": "loud"}, "/operator/logLevel"),
        ({"image.pullPolicy": "Sometimes"}, "/image/pullPolicy"),
        ({"image.digest": "latest"}, "/image/digest"),
        ({"operator.watchNamespace": "Not_A_Namespace"}, "/operator/watchNamespace"),
        ({"metrics.port": "70000"}, "/metrics/port"),
        ({"metrics.podMonitor.interval": "soon"}, "/metrics/podMonitor/interval"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, str], error: str) -> None:
    result = run("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *set_args(values))
    assert result.returncode != 0
    assert error in result.stderr


def test_service_account_name_required_when_not_created() -> None:
    result = run("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "--set", "serviceAccount.create=false")
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr


def _leaf_and_branch_keys(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(f"{prefix}{key}")
            if isinstance(value, dict) and value and prefix.count(".") < 1:
                out += _leaf_and_branch_keys(value, f"{prefix}{key}.")
    return out


# Keys whose values are free-form Kubernetes objects: their own keys need no comment.
FREE_FORM = {"podSecurityContext", "securityContext", "requests", "limits"}


def test_every_values_key_is_commented() -> None:
    """Each key of values.yaml (outside free-form Kubernetes objects) has a comment right above it,
    or opens a block whose first line is a comment."""
    lines = VALUES.read_text().splitlines()
    key_re = re.compile(r"^(\s*)([A-Za-z][\w-]*):")
    parents: list[tuple[int, str]] = []
    checked = 0
    for index, line in enumerate(lines):
        match = key_re.match(line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        parents = [(i, k) for i, k in parents if i < indent]
        if not any(k in FREE_FORM for _, k in parents):
            above = lines[index - 1].strip() if index else ""
            below = lines[index + 1].strip() if index + 1 < len(lines) else ""
            commented = above.startswith("#") or (line.rstrip().endswith(":") and below.startswith("#"))
            assert commented, f"values.yaml line {index + 1} has no comment: {line.strip()}"
            checked += 1
        parents.append((indent, key))
    assert checked > 40


def test_schema_is_strict_everywhere() -> None:
    schema = json.loads(SCHEMA.read_text())

    def walk(node: dict[str, Any], where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, where
            for key, child in node["properties"].items():
                walk(child, f"{where}.{key}")

    walk(schema, "values")


def test_schema_knows_every_default_key() -> None:
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load(VALUES.read_text())
    for dotted in _leaf_and_branch_keys(values):
        node = schema
        for part in dotted.split("."):
            assert part in node.get("properties", {}), f"{dotted} missing from values.schema.json"
            node = node["properties"][part]


NOTES_PROBE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-probe
data:
  notes: {{ tpl (.Files.Get "notes-probe.txt") . | quote }}
"""


def render_notes(tmp_path: Path, *extra: str) -> str:
    """NOTES.txt rendered through `tpl` in a copy of the chart (helm template skips NOTES, and a
    client-side dry-run install still wants a cluster in helm 3.19)."""
    copy = tmp_path / "xpyd-operator"
    shutil.copytree(CHART, copy)
    (copy / "notes-probe.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (copy / "templates" / "notes-probe.yaml").write_text(NOTES_PROBE)
    args = ["template", "rel", str(copy), "-n", "xpyd-system", "--kube-version", KUBE_VERSION]
    result = run(*args, "--show-only", "templates/notes-probe.yaml", *extra)
    assert result.returncode == 0, result.stderr
    return str(yaml.safe_load(result.stdout)["data"]["notes"])


def test_notes_render(tmp_path: Path) -> None:
    notes = render_notes(tmp_path)
    assert "kubectl -n xpyd-system rollout status deployment/rel-xpyd-operator" in notes
    assert "every namespace" in notes


NO_MONITOR = "No PodMonitor was created"
GITOPS_HINT = "Set metrics.podMonitor.enabled=true"


@pytest.mark.parametrize(
    ("extra", "present", "absent"),
    [
        ((), [NO_MONITOR, "no Prometheus Operator API", GITOPS_HINT], []),
        (("-a", PROMETHEUS_OPERATOR_API), [], [NO_MONITOR]),
        (("--set", "metrics.podMonitor.enabled=true"), [], [NO_MONITOR]),
        (("--set", "metrics.podMonitor.enabled=false"), [NO_MONITOR, "MetricsMissing"], [GITOPS_HINT.split("=")[0]]),
        (("--set", "operator.watchNamespace=team-a", "-a", PROMETHEUS_OPERATOR_API), ["namespace team-a only"], []),
    ],
)
def test_notes_say_when_nothing_scrapes_the_workers(
    tmp_path: Path, extra: tuple[str, ...], present: list[str], absent: list[str]
) -> None:
    notes = render_notes(tmp_path, *extra)
    for words in present:
        assert words in notes
    for words in absent:
        assert words not in notes
