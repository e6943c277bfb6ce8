"""Engine upgrades: which revision a pool runs, when decode has rolled out, and who serves what."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_api import labels as L
from xpyd_operator import groups, rollout


def sts(rev: str, replicas: int = 2, **status: Any) -> dict[str, Any]:
    base = {
        "observedGeneration": 3,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "currentRevision": "a",
        "updateRevision": "a",
    }
    return {
        "metadata": {"generation": 3},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {L.ENGINE_REV: rev}}}},
        "status": {**base, **status},
    }


def test_engine_rev_follows_image_and_connector() -> None:
    a = rollout.engine_rev("vllm/vllm-openai:v0.11.0", "NixlConnector")
    assert a == rollout.engine_rev("vllm/vllm-openai:v0.11.0", "NixlConnector")
    assert a != rollout.engine_rev("vllm/vllm-openai:v0.12.0", "NixlConnector")
    assert a != rollout.engine_rev("vllm/vllm-openai:v0.11.0", "MooncakeConnector")
    assert len(a) == 10 and a.isalnum()


@pytest.mark.parametrize(
    ("obj", "rev", "done"),
    [
        (sts("new"), "new", True),
        (sts("old"), "new", False),
        (sts("new", updatedReplicas=1), "new", False),
        (sts("new", readyReplicas=1), "new", False),
        (sts("new", updateRevision="b"), "new", False),
        (sts("new", observedGeneration=2), "new", False),
        (None, "new", False),
    ],
)
def test_rolled_out(obj: dict[str, Any] | None, rev: str, done: bool) -> None:
    assert rollout.rolled_out(obj, rev) is done


@pytest.mark.parametrize(
    ("desired", "observed", "held"),
    [
        ({"decode": "v2", "prefill": "v2"}, {"decode": sts("v1"), "prefill": sts("v1")}, True),
        ({"decode": "v2", "prefill": "v2"}, {"decode": sts("v2"), "prefill": sts("v1")}, False),
        ({"decode": "v2", "prefill": "v2"}, {"decode": sts("v2", readyReplicas=0), "prefill": sts("v1")}, True),
        ({"decode": "v1", "prefill": "v1"}, {"decode": sts("v1"), "prefill": sts("v1")}, False),  # a resize
        ({"decode": "v2", "prefill": "v2"}, {"decode": sts("v1")}, False),  # a new prefill pool
    ],
)
def test_prefill_waits_for_decode_on_leaderworkersets(
    desired: dict[str, str], observed: dict[str, Any], held: bool
) -> None:
    want = {(groups.KIND, role): sts(rev) for role, rev in desired.items()}
    have = {(groups.KIND, role): obj for role, obj in observed.items()}
    assert rollout.held_back(want, have, "decode", "prefill") is held
    # StatefulSet pools step through an engine change together (xpyd_operator.lockstep): nothing waits
    want = {("StatefulSet", role): sts(rev) for role, rev in desired.items()}
    have = {("StatefulSet", role): obj for role, obj in observed.items()}
    assert rollout.held_back(want, have, "decode", "prefill") is False
    # one pool of each kind: decode first, as on LeaderWorkerSets
    want = {("StatefulSet", "decode"): sts(desired["decode"]), (groups.KIND, "prefill"): sts(desired["prefill"])}
    have = {("StatefulSet" if r == "decode" else groups.KIND, r): obj for r, obj in observed.items()}
    assert rollout.held_back(want, have, "decode", "prefill") is held


def pod(role: str, image: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"labels": {L.ROLE: role}},
        "spec": {"containers": [{"image": image}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_serving_revisions_counts_ready_pods_per_image() -> None:
    pods = [pod("decode", "v2"), pod("decode", "v1"), pod("decode", "v2"), pod("decode", "v3", ready=False)]
    pods.append(pod("prefill", "v1"))
    assert rollout.serving_revisions(pods, "decode") == {"v1": 1, "v2": 2}
    assert rollout.serving_revisions(pods, "prefill") == {"v1": 1}
    assert rollout.serving_revisions(pods, "worker") == {}
