"""The operator under faults and edits: cascade delete, scalers, hand deletions, bad edits, restarts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Service, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role

from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube, op_namespace, operator_proc, dd)
from .operator_fixtures import (
    CHILDREN,
    DD,
    Kube,
    OperatorProcess,
    all_children,
    converged,
    dd_manifest,
    sts_template,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_cascade_delete_removes_every_child(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    uid = dd("gone")["metadata"]["uid"]
    wait_for(lambda: all_children(op_kube, op_namespace, "gone", uid), 60, what="children")
    op_kube.client.delete(DD, "gone", namespace=op_namespace)

    def all_gone() -> bool:
        return all(op_kube.get(res, op_namespace, f"gone-{role}") is None for res, role in CHILDREN)

    wait_for(all_gone, 90, what="garbage collection of every child")


def test_replicas_are_left_alone_when_omitted(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    dd("hpa", decode={"gpusPerReplica": 2})
    wait_for(lambda: op_kube.get(StatefulSet, op_namespace, "hpa-decode"), 60, what="decode StatefulSet")
    scale = {"spec": {"replicas": 3}}
    op_kube.client.patch(StatefulSet, "hpa-decode", scale, namespace=op_namespace, field_manager="an-hpa")
    wait_for(lambda: converged(op_kube, op_namespace, "hpa", "1P3D"), 60, what="status following the scaler")
    time.sleep(2 * 5.5)  # two resync periods of the module's operator: it must not scale back to 1
    sts = op_kube.get(StatefulSet, op_namespace, "hpa-decode")
    assert sts is not None
    assert sts["spec"]["replicas"] == 3


def test_hand_deleted_child_is_recreated(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    uid = dd("phoenix")["metadata"]["uid"]
    wait_for(lambda: all_children(op_kube, op_namespace, "phoenix", uid), 60, what="children")
    old: dict[tuple[Any, str], str] = {}
    victims: list[tuple[Any, str]] = [(StatefulSet, "decode"), (Service, "router"), (Role, "router")]
    for res, role in victims:
        obj = op_kube.get(res, op_namespace, f"phoenix-{role}")
        assert obj is not None
        old[(res, role)] = obj["metadata"]["uid"]
        op_kube.client.delete(res, f"phoenix-{role}", namespace=op_namespace)

    def recreated() -> bool:
        for (res, role), before in old.items():
            obj = op_kube.get(res, op_namespace, f"phoenix-{role}")
            if obj is None or obj["metadata"]["uid"] == before:
                return False
        return True

    wait_for(recreated, 60, what="deleted children recreated")


def test_edits_roll_and_bad_edits_leave_children_untouched(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    dd("edit")
    wait_for(lambda: converged(op_kube, op_namespace, "edit", "1P2D"), 60, what="1P2D")
    dd("edit", engine={"image": "vllm/vllm-openai:v0.12.0"}, prefill={"replicas": 2, "gpusPerReplica": 2})

    def rolled() -> bool:
        sts = op_kube.get(StatefulSet, op_namespace, "edit-prefill")
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"] if sts else None
        return bool(sts and sts["spec"]["replicas"] == 2 and image == "vllm/vllm-openai:v0.12.0")

    wait_for(rolled, 60, what="image and replicas edit applied")
    before = sts_template(op_kube, op_namespace, "edit-decode")
    dd("edit", model={"name": "acme/not-a-model-7b"})

    def blocked() -> dict[str, Any] | None:
        ready = op_kube.condition(op_namespace, "edit", "Ready")
        return ready if ready and ready["reason"] == "UnknownModel" else None

    ready = wait_for(blocked, 60, what="Ready=False UnknownModel")
    assert ready["status"] == "False"
    assert "kvBytesPerToken" in ready["message"]
    assert sts_template(op_kube, op_namespace, "edit-decode") == before


def test_restart_mid_reconcile_converges(op_kube: Kube, tmp_path: Path) -> None:
    ns = op_kube.create_namespace("xpyd-restart")
    proc = OperatorProcess([ns], tmp_path / "operator.log")
    try:
        uid = op_kube.apply_dd(dd_manifest("again", ns))["metadata"]["uid"]
        proc.start()
        wait_for(lambda: op_kube.get(ServiceAccount, ns, "again-router"), 60, what="first child")
        proc.kill()  # mid-reconcile or just after: either way no cleanup ran
        proc.start()
        wait_for(
            lambda: all_children(op_kube, ns, "again", uid),
            60,
            what=f"children after restart\n{proc.log_tail()}",
        )
        status = wait_for(lambda: converged(op_kube, ns, "again", "1P2D"), 60, what="status after restart")
        assert {c["type"] for c in status["conditions"]} >= {"Ready", "Progressing", "TopologySatisfied"}
        sets = [str(s.metadata.name if s.metadata else "") for s in op_kube.client.list(StatefulSet, namespace=ns)]
        assert sorted(sets) == ["again-decode", "again-prefill"]
    finally:
        proc.stop()
        op_kube.delete_namespace(ns)


def test_gpu_request_no_node_can_hold_sets_ready_false(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    dd("toobig", topology="Any", decode={"replicas": 1, "gpusPerReplica": 16})  # one pod: no node has 16

    def blocked() -> dict[str, Any] | None:
        ready = op_kube.condition(op_namespace, "toobig", "Ready")
        return ready if ready and ready["reason"] == "Unschedulable" else None

    ready = wait_for(blocked, 60, what="Ready=False Unschedulable")
    assert ready["status"] == "False"
    assert "decode.gpusPerReplica=16 fits no node" in ready["message"]
    assert op_kube.get(StatefulSet, op_namespace, "toobig-decode") is None
