"""helm template over option combinations: workloads, monitoring, dashboards and CRDs render as promised."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from xpyd_chart.helm import CHART, REPO, kinds, one, template
from xpyd_chart.sync import stale_crds

pytestmark = pytest.mark.usefixtures("helm")

CLUSTER_MODE = ("ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment")
DIGEST = "sha256:" + "a" * 64
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


@pytest.mark.parametrize(
    ("values", "monitoring", "want"),
    [
        (
            {},
            False,
            [*CLUSTER_MODE, "Service", "ServiceAccount"],
        ),
        (
            {},
            True,
            [*CLUSTER_MODE, "PodMonitor", "Service", "ServiceAccount", "ServiceMonitor"],
        ),
        (
            {"operator.watchNamespace": "team-a"},
            True,
            [
                *CLUSTER_MODE,
                "PodMonitor",
                "Role",
                "RoleBinding",
                "Service",
                "ServiceAccount",
                "ServiceMonitor",
            ],
        ),
        (
            {"operator.watchNamespace": "team-a", "rbac.clusterReads": "false"},
            False,
            [
                "ConfigMap",
                "CustomResourceDefinition",
                "Deployment",
                "Role",
                "RoleBinding",
                "Service",
                "ServiceAccount",
            ],
        ),
        (
            {"crds.install": "false", "dashboards.enabled": "false", "metrics.enabled": "false"},
            True,
            ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodMonitor", "ServiceAccount"],
        ),
        (
            {"rbac.create": "false", "serviceAccount.create": "false", "serviceAccount.name": "mine"},
            False,
            ["ConfigMap", "CustomResourceDefinition", "Deployment", "Service"],
        ),
        (
            {"metrics.serviceMonitor.enabled": "false", "metrics.podMonitor.enabled": "false"},
            True,
            [*CLUSTER_MODE, "Service", "ServiceAccount"],
        ),
    ],
)
def test_option_combinations(values: dict[str, str], monitoring: bool, want: list[str]) -> None:
    assert kinds(template(values, monitoring=monitoring)) == sorted(want)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    containers = pod["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_operator_deployment_defaults() -> None:
    docs = template()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = _container(docs)
    assert container["image"] == f"ghcr.io/xpyd/xpyd:{APP_VERSION}"
    assert container["command"] == ["xpyd"]
    assert container["args"][0] == "operator"
    assert "--all-namespaces" in container["args"]
    assert "--liveness=http://$(POD_IP):8080/healthz" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert {"name": "XPYD_METRICS_PORT", "value": "9090"} in container["env"]


def test_operator_cli_accepts_the_chart_args() -> None:
    """Every argument the chart passes parses with `xpyd operator`'s own parser."""
    from xpyd_operator.cli import _parser

    for values in ({}, {"operator.watchNamespace": "team-a", "operator.logLevel": "verbose"}):
        args = _container(template(values))["args"]
        assert args[0] == "operator"
        parsed = _parser().parse_args([a.replace("$(POD_IP)", "10.0.0.1") for a in args[1:]])
        assert parsed.liveness == "http://10.0.0.1:8080/healthz"


@pytest.mark.parametrize(
    ("values", "image"),
    [
        ({"image.tag": "v9"}, "ghcr.io/xpyd/xpyd:v9"),
        ({"image.repository": "kind.local/xpyd"}, f"kind.local/xpyd:{APP_VERSION}"),
        (
            {"image.digest": "sha256:" + "a" * 64, "image.tag": "ignored"},
            "ghcr.io/xpyd/xpyd@sha256:" + "a" * 64,
        ),
    ],
)
def test_image(values: dict[str, str], image: str) -> None:
    container = _container(template(values))
    assert container["image"] == image
    assert {"name": "XPYD_IMAGE", "value": image} in container["env"]


@pytest.mark.parametrize(
    ("values", "present", "absent"),
    [
        ({"operator.watchNamespace": "team-a"}, ["--namespace=team-a"], ["--all-namespaces"]),
        ({"operator.logLevel": "verbose"}, ["--verbose"], ["--quiet"]),
        ({"operator.logLevel": "quiet"}, ["--quiet"], ["--verbose"]),
        ({"operator.healthPort": "8181"}, ["--liveness=http://$(POD_IP):8181/healthz"], []),
        ({"operator.extraArgs[0]": "--dev"}, ["--dev"], []),
    ],
)
def test_operator_args(values: dict[str, str], present: list[str], absent: list[str]) -> None:
    args = _container(template(values))["args"]
    for arg in present:
        assert arg in args
    for arg in absent:
        assert arg not in args


@pytest.mark.parametrize(
    ("values", "scraped"),
    [({}, True), ({"metrics.scrapeAnnotations": "false"}, False), ({"metrics.enabled": "false"}, False)],
)
def test_scrape_annotations(values: dict[str, str], scraped: bool) -> None:
    values = {**values, "operator.podAnnotations.team": "ml"}
    pod = one(template(values), "Deployment")["spec"]["template"]["metadata"]
    assert pod["annotations"]["team"] == "ml"
    assert (pod["annotations"].get("prometheus.io/scrape") == "true") is scraped
    if scraped:
        assert pod["annotations"]["prometheus.io/port"] == "9090"


def test_monitors_select_what_they_should() -> None:
    docs = template(monitoring=True)
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service", "-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    pods = one(docs, "PodMonitor")
    assert pods["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "xpyd-operator"}
    assert pods["spec"]["namespaceSelector"] == {"any": True}
    rules = pods["spec"]["podMetricsEndpoints"][0]["relabelings"]
    # TLS routers are the operator's own PodMonitors' (routerkit.pod_monitor), scraped over HTTPS: dropped here.
    assert rules[0] == {
        "sourceLabels": ["__meta_kubernetes_pod_annotation_prometheus_io_scheme"],
        "regex": "https",
        "action": "drop",
    }
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in rules[1:]}
    assert relabel == {
        "xpyd_deployment": ["__meta_kubernetes_pod_label_xpyd_io_deployment"],
        "xpyd_role": ["__meta_kubernetes_pod_label_xpyd_io_role"],
    }
    scoped = one(template({"operator.watchNamespace": "team-a"}, monitoring=True), "PodMonitor")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_dashboards_are_configmaps_for_grafanas_sidecar() -> None:
    maps = [d for d in template({"dashboards.namespace": "grafana"}) if d["kind"] == "ConfigMap"]
    committed = sorted(p.name for p in (REPO / "dashboards").glob("*.json"))
    assert sorted(name for m in maps for name in m["data"]) == committed
    for configmap in maps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["namespace"] == "grafana"
        for name, text in configmap["data"].items():
            assert json.loads(text) == json.loads((REPO / "dashboards" / name).read_text())


def test_chart_crds_match_crds_folder() -> None:
    assert stale_crds() == [], "run: .venv/bin/python -m xpyd_chart"


@pytest.mark.parametrize("keep", [True, False])
def test_rendered_crds_equal_the_source(keep: bool) -> None:
    docs = [d for d in template({"crds.keep": str(keep).lower()}) if d["kind"] == "CustomResourceDefinition"]
    sources = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    assert len(docs) == len(sources) >= 1
    by_name = {d["metadata"]["name"]: d for d in docs}
    for source in sources:
        rendered = by_name[source["metadata"]["name"]]
        annotations = rendered["metadata"].pop("annotations", {})
        assert (annotations.get("helm.sh/resource-policy") == "keep") is keep
        labels = rendered["metadata"].pop("labels")
        assert labels["app.kubernetes.io/part-of"] == "xpyd"
        source["metadata"].pop("labels", None)
        source["metadata"].pop("annotations", None)
        assert rendered == source


@pytest.mark.parametrize(
    ("values", "env"),
    [
        ({}, {}),
        (
            {"operator.modelHub.enabled": "true"},
            {"XPYD_MODEL_HUB": {"value": "true"}, "HF_ENDPOINT": {"value": "https://huggingface.co"}},
        ),
        (
            {
                "operator.modelHub.enabled": "true",
                "operator.modelHub.endpoint": "https://hf-mirror.example.com",
                "operator.modelHub.tokenSecret.name": "hf",
            },
            {
                "XPYD_MODEL_HUB": {"value": "true"},
                "HF_ENDPOINT": {"value": "https://hf-mirror.example.com"},
                "HF_TOKEN": {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
            },
        ),
        ({"operator.modelHub.tokenSecret.name": "hf"}, {}),  # off: no token either
    ],
)
def test_model_hub_env(values: dict[str, str], env: dict[str, dict[str, Any]]) -> None:
    """The model hub reaches the operator as environment; the token by secretKeyRef (no Secret read grant)."""
    hub_names = {"XPYD_MODEL_HUB", "HF_ENDPOINT", "HF_TOKEN"}
    got = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in _container(template(values))["env"]}
    assert {k: v for k, v in got.items() if k in hub_names} == env


@pytest.mark.parametrize(
    ("values", "monitoring", "env"),
    [
        ({}, False, {}),  # no PodMonitor API: the chart renders none, the operator makes none
        ({}, True, {"XPYD_ROUTER_POD_MONITOR": "true", "XPYD_POD_MONITOR_INTERVAL": "15s"}),
        (
            {"metrics.podMonitor.interval": "30s", "metrics.podMonitor.labels.release": "kps"},
            True,
            {
                "XPYD_ROUTER_POD_MONITOR": "true",
                "XPYD_POD_MONITOR_INTERVAL": "30s",
                "XPYD_POD_MONITOR_LABELS": '{"release":"kps"}',
            },
        ),
        ({"metrics.podMonitor.enabled": "false"}, True, {}),
        ({"metrics.podMonitor.enabled": "true"}, False, {"XPYD_ROUTER_POD_MONITOR": "true",
                                                         "XPYD_POD_MONITOR_INTERVAL": "15s"}),
    ],
)  # fmt: skip
def test_the_operator_monitors_tls_routers_as_the_chart_monitors_the_rest(
    values: dict[str, str], monitoring: bool, env: dict[str, str]
) -> None:
    names = {"XPYD_ROUTER_POD_MONITOR", "XPYD_POD_MONITOR_INTERVAL", "XPYD_POD_MONITOR_LABELS"}
    got = {e["name"]: e.get("value") for e in _container(template(values, monitoring=monitoring))["env"]}
    assert {k: v for k, v in got.items() if k in names} == env
