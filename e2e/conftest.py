"""e2e fixtures: the cluster comes from KUBECONFIG (make test brings the local one up), a namespace per test.

`make e2e` runs most files on E2E_WORKERS processes at once (pytest-xdist, `--dist loadfile`: each file
whole in one process), then the tests marked `serial` here alone: those that stop what every test shares
(the control plane, Prometheus), change it (the CRD's owner, nodes' capacity), take most of a topology's
GPUs (the multi-node groups, the reference examples) or load the machine (the real vLLM pods). What runs
at once takes at most a rack and a few HGX nodes: test_operator.py's deployments, and a few GPUs each.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from testkit.kube_operator import Kube

from .kube import kubectl

SERIAL: tuple[str, ...] = (
    "test_real_vllm.py",
    "test_chart.py",
    "test_reference_examples.py",
    "test_multinode.py",
    "test_faults_under_load.py::test_control_plane_restart_under_load",
    "test_faults_under_load.py::test_prometheus_down_holds_sizes_and_says_so",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.removeprefix("e2e/").startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session", autouse=True)
def _cluster() -> None:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("e2e tests need KUBECONFIG: run `make e2e` (it brings the local cluster up) or export it")
    kubectl("get", "--raw", "/readyz")
    # The CRD before any test: files that run at once would otherwise race to install it (a chart release
    # takes it when none exists). Server-side apply, so every process may do it.
    kube = Kube()
    try:
        kube.install_crd()
    finally:
        kube.close()


@pytest.fixture
def namespace() -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    kubectl("delete", "namespace", name, "--wait=false")
