"""e2e fixtures: the cluster comes from KUBECONFIG (make test brings the local one up), a namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from .kube import kubectl


@pytest.fixture(scope="session", autouse=True)
def _cluster() -> None:
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("e2e tests need KUBECONFIG: run `make e2e` (it brings the local cluster up) or export it")
    kubectl("get", "--raw", "/readyz")


@pytest.fixture
def namespace() -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    kubectl("delete", "namespace", name, "--wait=false")
