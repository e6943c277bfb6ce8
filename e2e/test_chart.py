"""helm install, upgrade and uninstall on the cluster named by KUBECONFIG; the operator it deploys
reconciles a DisaggregatedDeployment under its own ServiceAccount and can do no more than it needs."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from xpyd_chart.helm import CHART, KUBE_VERSION
from xpyd_chart.helm import run as helm

from .kube import find_json as get_json
from .kube import kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELEASE = "xpyd-e2e"
CRD = "disaggregateddeployments.xpyd.io"
SMALL_DD = """
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {{name: chart-probe, namespace: {ns}}}
spec:
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  engine: {{kind: emulator}}
  mode: Disaggregated
  topology: {{kind: HGX-B200}}
  prefill: {{replicas: 1, gpusPerReplica: 1}}
  decode: {{replicas: 1, gpusPerReplica: 1}}
  router: {{replicas: 1}}
"""


def wait_for(what: str, probe: Any, timeout: float = 180.0) -> Any:
    """Poll probe() until it returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def helm_ok(*args: str) -> str:
    result = helm(*args, timeout=300)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("KUBECONFIG must name the cluster for e2e tests")
    ns = f"xpyd-chart-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    yield ns
    helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _crd_values(ns: str) -> list[str]:
    """Install the CRD with the chart, adopting a copy left by kubectl or by a release that is gone;
    leave it alone while another live release owns it."""
    crd = get_json("crd", CRD)
    if crd is None:
        return []
    notes = crd["metadata"].get("annotations") or {}
    owner = (notes.get("meta.helm.sh/release-name"), notes.get("meta.helm.sh/release-namespace"))
    if owner == (RELEASE, ns):
        return []
    live = owner[0] is not None and helm("status", owner[0], "-n", str(owner[1])).returncode == 0
    return ["--set", "crds.install=false"] if live else ["--take-ownership"]


def _operator_pod(ns: str) -> dict[str, Any] | None:
    pods = get_json("pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")
    items = pods["items"] if pods else []
    running = [p for p in items if p["status"].get("phase") == "Running"]
    return running[0] if running else None


def _reconciled(ns: str) -> dict[str, Any] | None:
    dd = get_json("dd", "chart-probe", "-n", ns)
    if not dd or not (dd.get("status") or {}).get("xpyd"):
        return None
    children = [
        get_json("statefulset", "chart-probe-prefill", "-n", ns),
        get_json("statefulset", "chart-probe-decode", "-n", ns),
        get_json("deployment", "chart-probe-router", "-n", ns),
        get_json("role", "chart-probe-router", "-n", ns),
    ]
    return dd if all(children) else None


def can_i(ns: str, *args: str) -> bool:
    sa = f"system:serviceaccount:{ns}:{RELEASE}-xpyd-operator"
    result = kubectl("auth", "can-i", *args, f"--as={sa}", check=False)
    return result.stdout.strip() == "yes"


def test_install_reconcile_upgrade_uninstall(namespace: str) -> None:
    ns = namespace
    # Namespace-scoped mode keeps this operator away from any other operator's deployments.
    values = ["--set", f"operator.watchNamespace={ns}", *_crd_values(ns)]
    out = helm_ok("install", RELEASE, str(CHART), "-n", ns, *values, "--wait", "--timeout", "180s")
    assert "xpyd-operator" in out
    pod = wait_for("the operator pod to run", lambda: _operator_pod(ns))
    assert pod["spec"]["serviceAccountName"] == f"{RELEASE}-xpyd-operator"
    wait_for("the CRD to be established", lambda: get_json("crd", CRD))

    kubectl("apply", "-f", "-", stdin=SMALL_DD.format(ns=ns))
    dd = wait_for("the operator to reconcile chart-probe", lambda: _reconciled(ns))
    assert dd["status"]["xpyd"] == "1P1D"

    # Upgrade: a changed value rolls the operator (Recreate) and it keeps reconciling.
    helm_ok(
        "upgrade", RELEASE, str(CHART), "-n", ns, *values, "--set", "operator.logLevel=verbose",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    deployment = get_json("deployment", f"{RELEASE}-xpyd-operator", "-n", ns)
    assert deployment is not None
    assert "--verbose" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    revision = json.loads(helm_ok("status", RELEASE, "-n", ns, "-o", "json"))["version"]
    assert revision == 2
    kubectl("delete", "statefulset", "chart-probe-decode", "-n", ns)
    wait_for("the upgraded operator to restore a deleted child", lambda: _reconciled(ns))

    helm_ok("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    wait_for(
        "the operator Deployment to go",
        lambda: get_json("deployment", f"{RELEASE}-xpyd-operator", "-n", ns) is None,
    )
    assert get_json("crd", CRD) is not None, "crds.keep must keep the CRD (and users' deployments)"


def test_operator_service_account_can_do_no_more_than_it_needs(namespace: str) -> None:
    ns = namespace
    values = ["--set", f"operator.watchNamespace={ns}", *_crd_values(ns)]
    helm_ok("upgrade", "--install", RELEASE, str(CHART), "-n", ns, *values)
    allowed = [
        ("create", "statefulsets.apps", "-n", ns),
        ("patch", "disaggregateddeployments.xpyd.io", "--subresource=status", "-n", ns),
        ("list", "pods", "-n", ns),
        ("create", "roles.rbac.authorization.k8s.io", "-n", ns),
        ("list", "nodes"),
        ("get", "configmaps", "-n", ns),  # spec.model.configMap
    ]
    denied = [
        ("get", "secrets", "-n", ns),
        ("list", "secrets", "--all-namespaces"),
        ("list", "configmaps", "-n", ns),
        ("watch", "configmaps", "-n", ns),
        ("get", "configmaps", "-n", "default"),
        ("create", "pods", "-n", ns),
        ("delete", "nodes"),
        ("create", "statefulsets.apps", "-n", "default"),
        ("patch", "disaggregateddeployments.xpyd.io", "-n", ns),
        ("escalate", "roles.rbac.authorization.k8s.io", "-n", ns),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
    ]
    wait_for("the RoleBinding to take effect", lambda: can_i(ns, *allowed[0]), timeout=30)
    for check in allowed:
        assert can_i(ns, *check), f"the operator needs: {' '.join(check)}"
    for check in denied:
        assert not can_i(ns, *check), f"the operator must not: {' '.join(check)}"


def test_examples_pass_the_api_servers_validation(namespace: str) -> None:
    """Every example DisaggregatedDeployment passes the CRD's schema and CEL rules (server dry-run)."""

    wait_for("the CRD", lambda: get_json("crd", CRD))
    examples = sorted((CHART.parents[1] / "examples").rglob("*.yaml"))
    checked = 0
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "DisaggregatedDeployment":
                continue
            doc["metadata"]["namespace"] = namespace
            result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
            assert result.returncode == 0, f"{path.name}: {result.stderr}"
            checked += 1
    assert checked >= 5
    bad = SMALL_DD.format(ns=namespace).replace("gpusPerReplica: 1}", "gpusPerReplica: 12}", 1)
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=bad, check=False)
    assert result.returncode != 0
    assert "gpusPerReplica must be <= 8 or a multiple of 8 on HGX-B200" in result.stderr


def test_cluster_mode_rbac_allows_only_what_the_operator_uses(namespace: str) -> None:
    """The default (cluster-wide) ClusterRole, applied without a second operator running."""
    release = "xpyd-e2e-rbac"
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    args += ["--show-only", "templates/serviceaccount.yaml"]
    rendered = helm_ok(*args, "--show-only", "templates/rbac.yaml")
    kubectl("apply", "-f", "-", stdin=rendered)
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-xpyd-operator"

        def can(*check: str) -> bool:
            result = kubectl("auth", "can-i", *check, f"--as={sa}", check=False)
            return result.stdout.strip() == "yes"

        wait_for("the ClusterRoleBinding to take effect", lambda: can("list", "nodes"), timeout=30)
        for check in [
            ("create", "statefulsets.apps", "-n", "default"),
            ("watch", "disaggregateddeployments.xpyd.io", "--all-namespaces"),
            ("create", "poddisruptionbudgets.policy", "-n", "default"),
            ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ]:
            assert can(*check), f"the operator needs: {' '.join(check)}"
        for check in [
            ("get", "secrets", "--all-namespaces"),
            ("list", "configmaps", "--all-namespaces"),
            ("create", "pods", "-n", "default"),
            ("update", "nodes"),
            ("create", "customresourcedefinitions.apiextensions.k8s.io"),
            ("delete", "disaggregateddeployments.xpyd.io", "-n", "default"),
            ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ]:
            assert not can(*check), f"the operator must not: {' '.join(check)}"
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", stdin=rendered, check=False)
