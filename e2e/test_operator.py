"""The operator against a real API server: placement on HGX and NVL72, status, rejection, serving."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube, op_namespace, operator_proc, dd)
from .operator_fixtures import (
    CLIQUE,
    DD,
    Kube,
    all_children,
    converged,
    dd_manifest,
    pods_of,
    role_of,
    status_of,
    sts_template,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_hgx_apply_creates_placed_children(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    uid = dd("hgx")["metadata"]["uid"]
    wait_for(lambda: all_children(op_kube, op_namespace, "hgx", uid), 60, what="all 11 children")
    status = wait_for(lambda: converged(op_kube, op_namespace, "hgx", "1P2D"), 60, what="status 1P2D")
    topo = next(c for c in status["conditions"] if c["type"] == "TopologySatisfied")
    assert (topo["status"], topo["reason"]) == ("True", "OneNodePerReplica")
    assert status["placement"]["kvPath"] == "RDMA"
    pod = sts_template(op_kube, op_namespace, "hgx-prefill")["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert "--kv-transfer-config" in pod["containers"][0]["command"]

    def bound() -> list[str] | None:
        nodes = [
            p.spec.nodeName
            for p in pods_of(op_kube, op_namespace, "hgx")
            if p.metadata.labels["xpyd.io/role"] != "router"
        ]
        return nodes if len(nodes) == 3 and all(nodes) else None

    assert all(n.startswith("b200-") for n in wait_for(bound, 60, what="3 engine pods bound"))
    wait_for(
        lambda: len(status_of(op_kube, op_namespace, "hgx")["placement"].get("nodes", [])) >= 1,
        60,
        what="nodes",
    )


def _clique_of(kube: Kube, node: str) -> str:
    meta: Any = kube.client.get(Node, node).metadata
    return str(meta.labels[CLIQUE])


def test_nvl72_puts_both_pools_in_one_rack(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    pools = {"prefill": {"replicas": 2, "gpusPerReplica": 4}, "decode": {"replicas": 4, "gpusPerReplica": 4}}
    dd("rack", topology="GB200-NVL72", **pools)
    status = wait_for(lambda: converged(op_kube, op_namespace, "rack", "2P4D"), 60, what="status 2P4D")
    assert status["placement"]["kvPath"] == "NVLink"
    assert len(status["placement"]["cliques"]) == 1
    clique = status["placement"]["cliques"][0]
    for role in ("prefill", "decode"):
        assert (
            sts_template(op_kube, op_namespace, f"rack-{role}")["metadata"]["labels"]["xpyd.io/nvlink-domain"] == clique
        )
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["TopologySatisfied"]["status"] == "True"
    assert conds["ComputeDomainReady"]["reason"] in {"ComputeDomainCRDMissing", "Created"}

    def bound() -> list[str] | None:
        pods = [p for p in pods_of(op_kube, op_namespace, "rack") if p.metadata.labels["xpyd.io/role"] != "router"]
        return [p.spec.nodeName for p in pods] if len(pods) == 6 and all(p.spec.nodeName for p in pods) else None

    assert {_clique_of(op_kube, n) for n in wait_for(bound, 60, what="6 pods bound")} == {clique}


def test_spill_across_racks_says_so(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    pools = {"prefill": {"replicas": 4, "gpusPerReplica": 4}, "decode": {"replicas": 16, "gpusPerReplica": 4}}
    dd("spill", topology="GB200-NVL72", **pools)
    status = wait_for(lambda: converged(op_kube, op_namespace, "spill", "4P16D"), 60, what="status 4P16D")
    topo = next(c for c in status["conditions"] if c["type"] == "TopologySatisfied")
    assert (topo["status"], topo["reason"]) == ("False", "SpansRacks")
    assert "crosses racks" in topo["message"]
    assert status["placement"]["kvPath"] == "RDMA"
    labels = [
        sts_template(op_kube, op_namespace, f"spill-{r}")["metadata"]["labels"].get("xpyd.io/nvlink-domain")
        for r in ("prefill", "decode")
    ]
    assert labels[0] != labels[1]


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"prefill": {"replicas": 1, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}}},
         "spec.prefill.autoscaling.minReplicas", "minReplicas must be <= maxReplicas"),
        ({"prefill": {"replicas": 1, "gpusPerReplica": 12}}, "spec.prefill.gpusPerReplica", "of 8 on HGX-B200"),
        (
            {"topology": "GB200-NVL72", "prefill": {"replicas": 1, "gpusPerReplica": 76}},
            "spec.prefill.gpusPerReplica",
            "<= 72 on GB200-NVL72",
        ),
        ({"mode": "Colocated", "worker": {"replicas": 1}, "prefill": None}, "spec.decode", "Colocated"),
        ({"engine": {"kind": "tensorrt"}}, "spec.engine.kind", "Unsupported value"),
        ({"decode": {"replicas": -1}}, "spec.decode.replicas", "greater than or equal to 0"),
        ({"router": {"tokenizer": "hf:org/a..b"}}, "spec.router.tokenizer", "may not contain '..'"),
        ({"router": {"tokenizer": "hf:org/name@"}}, "spec.router.tokenizer", "should match"),
    ],
)  # fmt: skip
def test_invalid_objects_are_rejected_naming_the_field(
    op_kube: Kube, op_namespace: str, spec: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ApiError) as err:
        op_kube.apply_dd(dd_manifest("invalid", op_namespace, **spec))
    assert err.value.status.code == 422
    assert field in str(err.value.status.message)
    assert words in str(err.value.status.message)


def test_operator_writes_status_patch_only_throughstatus_of(op_kube: Kube, op_namespace: str) -> None:
    """A user's own apply of the spec is never fought over: the operator owns no spec field."""
    op_kube.apply_dd(dd_manifest("owner", op_namespace))
    obj = wait_for(
        lambda: converged(op_kube, op_namespace, "owner", "1P2D") and op_kube.get_dd(op_namespace, "owner"),
        60,
    )
    managers = {(m["manager"], m.get("subresource")) for m in obj["metadata"]["managedFields"]}
    assert ("xpyd-operator", "status") in managers
    assert ("xpyd-operator", None) not in managers
    op_kube.client.delete(DD, "owner", namespace=op_namespace)


def test_hgx_becomes_ready_and_serves_through_its_router(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    """The whole chain: engine pods (the emulator on the local cluster) and the router turn Ready=True."""
    dd("serve")

    def ready() -> dict[str, Any] | None:
        cond = op_kube.condition(op_namespace, "serve", "Ready")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(ready, 150, interval=1, what="Ready=True")
    assert cond["reason"] == "AllReplicasReady"
    router = [p for p in pods_of(op_kube, op_namespace, "serve") if role_of(p) == "router"]
    assert len(router) == 1
    ip = router[0].status.podIP
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello", "max_tokens": 4}
    reply = httpx.post(f"http://{ip}:8000/v1/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"]
