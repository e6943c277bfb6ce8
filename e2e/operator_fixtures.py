"""The e2e tests' fixtures for the operator, over the plain helpers in testkit/kube_operator.py.

Import the fixtures from a test module or conftest (`from .operator_fixtures import *`); the helpers
(Kube, OperatorProcess, dd_manifest, wait_for, ...) are re-exported here for the tests' convenience.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.core_v1 import Pod, Service, ServiceAccount
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from testkit.kube_operator import CRD_FILE as CRD_FILE
from testkit.kube_operator import DD as DD
from testkit.kube_operator import REPO as REPO
from testkit.kube_operator import XPYD as XPYD
from testkit.kube_operator import Kube as Kube
from testkit.kube_operator import OperatorProcess as OperatorProcess
from testkit.kube_operator import dd_manifest as dd_manifest
from testkit.kube_operator import wait_for as wait_for


@pytest.fixture(scope="session")
def op_kube() -> Iterator[Kube]:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("KUBECONFIG is not set: the operator e2e tests need a cluster")
    kube = Kube()
    kube.install_crd()
    yield kube
    kube.close()


@pytest.fixture(scope="module")
def op_namespace(op_kube: Kube) -> Iterator[str]:
    name = op_kube.create_namespace("xpyd-op")
    yield name
    op_kube.delete_namespace(name)


@pytest.fixture(scope="module")
def operator_proc(op_namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess([op_namespace], log).start()
    yield proc
    proc.stop()


CHILDREN = [
    (StatefulSet, "prefill"),
    (StatefulSet, "decode"),
    (Service, "prefill"),
    (Service, "decode"),
    (PodDisruptionBudget, "prefill"),
    (PodDisruptionBudget, "decode"),
    (Deployment, "router"),
    (Service, "router"),
    (ServiceAccount, "router"),
    (Role, "router"),
    (RoleBinding, "router"),
]
CLIQUE = "nvidia.com/gpu.clique"


@pytest.fixture
def dd(op_kube: Kube, op_namespace: str, operator_proc: OperatorProcess) -> Iterator[Any]:
    """Apply DisaggregatedDeployments through this; they are deleted after the test."""
    made: list[str] = []

    def apply(name: str, **spec: Any) -> dict[str, Any]:
        made.append(name)
        return op_kube.apply_dd(dd_manifest(name, op_namespace, **spec))

    yield apply
    for name in made:
        with contextlib.suppress(ApiError):
            op_kube.client.delete(DD, name, namespace=op_namespace)


def all_children(kube: Kube, ns: str, name: str, uid: str) -> bool:
    for res, role in CHILDREN:
        obj = kube.get(res, ns, f"{name}-{role}")
        if obj is None or obj["metadata"]["ownerReferences"][0]["uid"] != uid:
            return False
    return True


def status_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.get_dd(ns, name).get("status") or {}


def converged(kube: Kube, ns: str, name: str, xpyd: str) -> dict[str, Any] | None:
    obj = kube.get_dd(ns, name)
    status = obj.get("status") or {}
    if status.get("observedGeneration") == obj["metadata"]["generation"] and status.get("xpyd") == xpyd:
        return status
    return None


def pods_of(kube: Kube, ns: str, name: str) -> list[Any]:
    return list(kube.client.list(Pod, namespace=ns, labels={"xpyd.io/deployment": name}))


def role_of(pod: Any) -> str:
    return str(pod.metadata.labels.get("xpyd.io/role", ""))


def sts_template(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    sts = kube.get(StatefulSet, ns, name)
    assert sts is not None
    return dict(sts["spec"]["template"])
