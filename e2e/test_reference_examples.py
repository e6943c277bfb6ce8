"""The reference examples (examples/*.yaml reproducing llm-d's and Dynamo's deployments) apply on the local
cluster, their pods carry the real-cluster fields through a real API server, and they become Ready with the
emulator standing in for vLLM (the process kubelet runs vLLM images as `xpyd emulate`)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from lightkube.core.exceptions import ApiError

from xpyd_api.models import DisaggregatedDeploymentSpec

from .kube import get_json, is_local_cluster, kubectl
from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube)
from .operator_fixtures import DD, REPO, Kube, OperatorProcess, pods_of, role_of, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

# The examples tests/examples/test_reference_pods.py holds to the references' checklist (its REFERENCES).
EXAMPLES = ("llama-70b-hgx-b200.yaml", "deepseek-r1-wide-ep-hgx-b200.yaml", "deepseek-r1-gb200-nvl72.yaml")
RDMA = "rdma/ib"


def _example(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]
    return dict(doc)


@pytest.fixture(scope="module")
def local(op_kube: Kube) -> None:
    if not is_local_cluster():
        pytest.skip("the examples run real vLLM on GPUs; only the local cluster runs them as the emulator")
    # Clusters brought up before the fake nodes advertised RDMA slots: add them as a device plugin would.
    for node in get_json("nodes", "-l", "xpyd.io/local-node=true")["items"]:
        capacity = node["status"].get("capacity", {})
        if "nvidia.com/gpu" in capacity and RDMA not in capacity:
            path = "/status/capacity/" + RDMA.replace("/", "~1")
            patch = f'[{{"op": "add", "path": "{path}", "value": "64"}}]'
            kubectl("patch", "node", node["metadata"]["name"], "--subresource=status", "--type=json", "-p", patch)


@pytest.fixture(scope="module")
def namespaces(op_kube: Kube, local: None) -> Iterator[dict[str, str]]:
    names = {example: op_kube.create_namespace("xpyd-ref") for example in EXAMPLES}
    yield names
    for name in names.values():
        op_kube.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(namespaces: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator-ref") / "operator.log"
    proc = OperatorProcess(list(namespaces.values()), log).start()
    yield proc
    proc.stop()


def _cache_and_token(namespace: str, spec: DisaggregatedDeploymentSpec) -> list[str]:
    """The Secret and the model-cache PVC the example expects, bound to a hostPath PV; returns the PV's name."""
    made: list[str] = []
    if spec.model.token_secret is not None:
        ref = spec.model.token_secret
        kubectl("create", "secret", "generic", ref.name, f"--from-literal={ref.key}=hf_e2e", "-n", namespace)
    claim = spec.model.cache.persistent_volume_claim if spec.model.cache else None
    if claim is not None:
        pv = f"xpyd-e2e-{uuid.uuid4().hex[:8]}"
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {"xpyd.io/e2e": "true"}},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": f"/var/lib/{pv}"},  # nothing mounts it: the process kubelet ignores volumes
                "claimRef": {"namespace": namespace, "name": claim.claim_name},
            },
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim.claim_name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Ti"}}},
        }  # fmt: skip
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([volume, pvc]))
        made.append(pv)
    return made


def _ready(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    cond = kube.condition(namespace, name, "Ready")
    return cond if cond and cond["status"] == "True" else None


@pytest.mark.parametrize("example", EXAMPLES)
def test_reference_example_becomes_ready(
    example: str, op_kube: Kube, namespaces: dict[str, str], operator: OperatorProcess
) -> None:
    ns = namespaces[example]
    doc = _example(example)
    doc["metadata"]["namespace"] = ns
    # The examples scrape the cluster's Prometheus Service; here the pools keep their example sizes.
    doc["spec"]["autoscaling"] = {"enabled": False}
    spec = DisaggregatedDeploymentSpec.model_validate(doc["spec"])
    name = doc["metadata"]["name"]
    volumes = _cache_and_token(ns, spec)
    try:
        op_kube.apply_dd(doc)
        try:
            wait_for(lambda: _ready(op_kube, ns, name), 600, interval=2, what=f"{example} Ready=True")
        except AssertionError:
            status = op_kube.get_dd(ns, name).get("status")
            raise AssertionError(f"{example}: status {status}\noperator:\n{operator.log_tail()}") from None
        status = op_kube.get_dd(ns, name)["status"]
        assert status["xpyd"] == f"{spec.prefill.replicas}P{spec.decode.replicas}D"  # type: ignore[union-attr]
        engines = [p for p in pods_of(op_kube, ns, name) if role_of(p) in ("prefill", "decode")]
        layouts = spec.layouts()  # every pod of every group: replicas x pods per replica
        assert len(engines) == sum((p.replicas or 0) * layouts[r].pods for r, p in spec.pools().items())
        for pod in engines:  # what the API server kept of the real-cluster fields
            container = pod.spec.containers[0]
            env = {e.name: e for e in container.env}
            assert env["HF_TOKEN"].valueFrom.secretKeyRef.name == "hf-token"
            assert env["HF_HOME"].value == "/model-cache"
            volumes_by_name = {v.name: v for v in pod.spec.volumes}
            assert volumes_by_name["dshm"].emptyDir.medium == "Memory"
            assert volumes_by_name["model-cache"].persistentVolumeClaim.claimName == "model-cache"
            headless = "--headless" in " ".join(container.command)  # a multi-node group's other ranks serve no API
            if not headless:
                assert container.startupProbe.failureThreshold * container.startupProbe.periodSeconds >= 1800
            if spec.network is not None:
                assert container.resources.limits[RDMA] == "1"
                assert "IPC_LOCK" in container.securityContext.capabilities.add
    finally:
        with contextlib.suppress(ApiError):
            op_kube.client.delete(DD, name, namespace=ns)
        for pv in volumes:
            kubectl("delete", "pv", pv, "--wait=false", check=False)
