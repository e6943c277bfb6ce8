"""GitOps-safe rendering: monitors on demand without cluster capabilities, the documented values, the
Kubernetes floor, and pull secrets passed on to the pods the operator makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_chart.helm import CHART, KUBE_VERSION, REPO, kinds, one, run, template

pytestmark = pytest.mark.usefixtures("helm")

MONITORS = ("PodMonitor", "ServiceMonitor")


@pytest.mark.parametrize(
    ("enabled", "api", "rendered"),
    [
        ("auto", False, False),
        ("auto", True, True),
        ("true", False, True),
        ("true", True, True),
        ("false", True, False),
        ("false", False, False),
    ],
)
def test_monitor_switch(enabled: str, api: bool, rendered: bool) -> None:
    for monitor in MONITORS:
        key = "metrics.podMonitor.enabled" if monitor == "PodMonitor" else "metrics.serviceMonitor.enabled"
        found = [d for d in template({key: enabled}, monitoring=api) if d["kind"] == monitor]
        assert (len(found) == 1) is rendered, (monitor, enabled, api)


def test_default_is_auto() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["metrics"]["podMonitor"]["enabled"] == "auto"
    assert values["metrics"]["serviceMonitor"]["enabled"] == "auto"


def test_service_monitor_needs_the_metrics_service() -> None:
    docs = template({"metrics.serviceMonitor.enabled": "true", "metrics.enabled": "false"})
    assert "ServiceMonitor" not in kinds(docs)


def _documented_values() -> dict[str, Any]:
    text = (REPO / "docs" / "install.md").read_text()
    block = text.split("<!-- gitops-values", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    return dict(yaml.safe_load(block))


def _render_file(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run("template", "xpyd", str(CHART), "-n", "xpyd-system", "--kube-version", KUBE_VERSION, "-f", str(path))
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_documented_gitops_values_render_everything_without_a_cluster(tmp_path: Path) -> None:
    """`helm template` (Argo CD, Flux) never sees the cluster's APIs; the documented values still
    produce the monitors the autoscaler depends on."""
    docs = _render_file(_documented_values(), tmp_path)
    assert kinds(docs) == sorted(
        ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment",
         "PodMonitor", "Service", "ServiceAccount", "ServiceMonitor"]
    )  # fmt: skip
    for monitor in MONITORS:
        assert one(docs, monitor)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "ConfigMap")["metadata"]["namespace"] == "monitoring"


def test_schema_rejects_a_fourth_monitor_setting() -> None:
    args = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION]
    result = run(*args, "--set-string", "metrics.podMonitor.enabled=maybe")
    assert result.returncode != 0
    assert "/metrics/podMonitor/enabled" in result.stderr


@pytest.mark.parametrize(("kube", "ok"), [("1.27.9", False), ("1.28.0", True), ("1.34.1", True)])
def test_kubernetes_floor(kube: str, ok: bool) -> None:
    result = run("template", "rel", str(CHART), "--kube-version", kube)
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert "incompatible with Kubernetes" in result.stderr


def _operator_env(values: dict[str, str]) -> dict[str, Any]:
    container = one(template(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({}, None),
        ({"imagePullSecrets[0].name": "regcred"}, "regcred"),
        ({"imagePullSecrets[0].name": "a", "imagePullSecrets[1].name": "b"}, "a,b"),
    ],
)
def test_pull_secrets_reach_the_operators_pods(values: dict[str, str], names: str | None) -> None:
    env = _operator_env(values)
    assert env.get("XPYD_IMAGE_PULL_SECRETS") == names
    pod = one(template(values), "Deployment")["spec"]["template"]["spec"]
    assert pod.get("imagePullSecrets", []) == [{"name": n} for n in (names or "").split(",") if n]


def test_the_operator_reads_the_pull_secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from xpyd_operator.cli import _parser

    env = _operator_env({"imagePullSecrets[0].name": "a", "imagePullSecrets[1].name": "b"})
    monkeypatch.setenv("XPYD_IMAGE_PULL_SECRETS", str(env["XPYD_IMAGE_PULL_SECRETS"]))
    assert _parser().parse_args([]).image_pull_secret == ["a", "b"]
