"""Status computation: counts, xPyD label, conditions per situation, and what gets written."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, b200_nodes, nvl72_nodes, spec  # type: ignore[import-not-found]

from xpyd_api import conditions as C
from xpyd_api.models import DisaggregatedDeploymentStatus
from xpyd_operator import statuscalc
from xpyd_operator.desired import Desired, Observed, desire
from xpyd_operator.reconcile import transitions

IMG = "img:1"
NOW = "2026-11-30T00:00:00Z"


def _sts(name: str, want: int, ready: int, rolled: bool = True, kind: str = "StatefulSet") -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "generation": 2},
        "spec": {"replicas": want},
        "status": {
            "observedGeneration": 2 if rolled else 1,
            "readyReplicas": ready,
            "updatedReplicas": want,
            "currentRevision": "a",
            "updateRevision": "a",
        },
    }


def _observed(prefill: tuple[int, int], decode: tuple[int, int], router: tuple[int, int] = (1, 1)) -> Observed:
    obs = Observed(nodes=b200_nodes())
    obs.children[("StatefulSet", "llama-prefill")] = _sts("llama-prefill", *prefill)
    obs.children[("StatefulSet", "llama-decode")] = _sts("llama-decode", *decode)
    obs.children[("Deployment", "llama-router")] = _sts("llama-router", *router, kind="Deployment")
    obs.own_pods = [{"spec": {"nodeName": "b200-1"}}, {"spec": {"nodeName": "b200-0"}}, {"spec": {}}]
    for m in desire(OWNER, spec(), obs, IMG, IMG).children:  # the pools run the templates they were given
        if m["kind"] == "StatefulSet":
            obs.children[("StatefulSet", m["metadata"]["name"])]["spec"]["template"] = m["spec"]["template"]
    return obs


def _conds(status: DisaggregatedDeploymentStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


@pytest.mark.parametrize(
    ("prefill", "decode", "router", "ready", "xpyd"),
    [
        ((2, 2), (4, 4), (1, 1), ("True", "AllReplicasReady"), "2P4D"),
        ((2, 1), (4, 4), (1, 1), ("False", "ReplicasNotReady"), "2P4D"),
        ((2, 2), (4, 4), (1, 0), ("False", "ReplicasNotReady"), "2P4D"),
        ((0, 0), (4, 4), (1, 1), ("False", "ReplicasNotReady"), "0P4D"),
    ],
)
def test_ready_and_counts(
    prefill: tuple[int, int],
    decode: tuple[int, int],
    router: tuple[int, int],
    ready: tuple[str, str],
    xpyd: str,
) -> None:
    s = spec()
    obs = _observed(prefill, decode, router)
    status = statuscalc.compute(OWNER, 2, s, desire(OWNER, s, obs, IMG, IMG), obs, [], NOW)
    assert _conds(status)[C.READY] == ready
    assert status.xpyd == xpyd
    assert status.observed_generation == 2
    assert status.prefill is not None
    assert (status.prefill.replicas, status.prefill.ready_replicas) == prefill
    assert status.placement is not None
    assert status.placement.nodes == ["b200-0", "b200-1"]
    assert status.placement.kv_path == "RDMA"
    assert all(c.observed_generation == 2 for c in status.conditions)


def test_progressing_while_a_pool_rolls() -> None:
    s = spec()
    obs = _observed((2, 2), (4, 4))
    obs.children[("StatefulSet", "llama-decode")]["status"]["updateRevision"] = "b"
    status = statuscalc.compute(OWNER, 2, s, desire(OWNER, s, obs, IMG, IMG), obs, [], NOW)
    assert _conds(status)[C.PROGRESSING] == ("True", "RollingOut")
    waiting = _observed((2, 1), (4, 4))
    status = statuscalc.compute(OWNER, 2, s, desire(OWNER, s, waiting, IMG, IMG), waiting, [], NOW)
    assert _conds(status)[C.PROGRESSING] == ("True", "WaitingForReplicas")
    steady = _observed((2, 2), (4, 4))
    status = statuscalc.compute(OWNER, 2, s, desire(OWNER, s, steady, IMG, IMG), steady, [], NOW)
    assert _conds(status)[C.PROGRESSING] == ("False", "Complete")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"model": {"name": "acme/unknown-13b"}}, "UnknownModel"),
        ({"prefill": {"replicas": 1, "gpusPerReplica": 16}, "topology": {"kind": "Any"}}, "Unschedulable"),
        (
            {"prefill": {"replicas": 1, "gpusPerReplica": 8}, "topology": {"kind": "GB200-NVL72"}},
            "LeaderWorkerSetMissing",
        ),
    ],
)
def test_input_errors_block_without_touching_children(overrides: dict[str, Any], reason: str) -> None:
    s = spec(**overrides)
    obs = _observed((2, 2), (4, 4))
    obs.nodes = b200_nodes() + nvl72_nodes()
    desired = desire(OWNER, s, obs, IMG, IMG)
    assert desired.children == []
    assert desired.error is not None
    assert desired.error[0] == reason
    status = statuscalc.compute(OWNER, 3, s, desired, obs, [], NOW)
    conds = _conds(status)
    assert conds[C.READY] == ("False", reason)
    assert conds[C.PROGRESSING] == ("False", "Blocked")
    ready = next(c for c in status.conditions if c.type == C.READY)
    assert "left untouched" in ready.message


def test_unknown_model_with_kv_bytes_is_fine() -> None:
    s = spec(model={"name": "acme/unknown-13b", "kvBytesPerToken": 100000})
    assert desire(OWNER, s, _observed((1, 1), (1, 1)), IMG, IMG).error is None


@pytest.mark.parametrize(
    ("overrides", "status_reason"),
    [
        ({}, None),  # verdict from the model, either way, with numbers
        ({"topology": {"kind": "Any"}}, ("Unknown", "NoTopology")),
        ({"model": {"name": "acme/x", "kvBytesPerToken": 1000}}, ("Unknown", "NotModelled")),
    ],
)
def test_disaggregation_worthwhile(overrides: dict[str, Any], status_reason: tuple[str, str] | None) -> None:
    cond = statuscalc.worthwhile(spec(**overrides), 1)
    if status_reason is None:
        assert cond.status in {"True", "False"}
        assert " ms " in cond.message
        assert cond.reason in {"TransferBelowStall", "TransferAboveStall"}
    else:
        assert (cond.status, cond.reason) == status_reason


def test_nvl72_conditions_and_compute_domain_missing() -> None:
    s = spec(
        topology={"kind": "GB200-NVL72"},
        prefill={"replicas": 2, "gpusPerReplica": 4},
        decode={"replicas": 30, "gpusPerReplica": 4},
    )
    obs = _observed((2, 2), (30, 30))
    obs.nodes = nvl72_nodes()
    status = statuscalc.compute(OWNER, 1, s, desire(OWNER, s, obs, IMG, IMG), obs, [], NOW)
    conds = _conds(status)
    assert conds[C.TOPOLOGY_SATISFIED] == ("False", "SpansRacks")
    assert conds[C.COMPUTE_DOMAIN] == ("False", "ComputeDomainCRDMissing")
    assert status.placement is not None
    assert status.placement.kv_path == "RDMA"


def test_owned_view_ignores_other_writers() -> None:
    theirs = C.merge([], [C.make(C.AUTOSCALER_HEALTHY, True, "Ok")], NOW, ())
    a = DisaggregatedDeploymentStatus(xpyd="1P1D", conditions=theirs, autoscaler={"x": 1})
    b = DisaggregatedDeploymentStatus(xpyd="1P1D")
    assert statuscalc.owned_view(a) == statuscalc.owned_view(b) == {"xpyd": "1P1D", "conditions": []}


def test_transitions_become_events() -> None:
    old = C.merge([], [C.make(C.READY, False, "ReplicasNotReady")], NOW, C.RECONCILER_TYPES)
    new = [C.make(C.READY, True, "AllReplicasReady"), C.make(C.TOPOLOGY_SATISFIED, False, "SpansRacks", "x")]
    events = transitions(old, new)
    assert [(t, r) for t, r, _ in events] == [("Normal", "AllReplicasReady"), ("Warning", "SpansRacks")]
    assert transitions(new, new) == []


def test_desired_without_error_has_no_error() -> None:
    assert Desired(None, []).error is None
