"""Engine revisions: what a pool's revision follows, and which revisions serve."""

from __future__ import annotations

from typing import Any

from xpyd_api import labels as L
from xpyd_operator import rollout


def test_engine_rev_follows_image_and_connector() -> None:
    a = rollout.engine_rev("vllm/vllm-openai:v0.11.0", "NixlConnector")
    assert a == rollout.engine_rev("vllm/vllm-openai:v0.11.0", "NixlConnector")
    assert a != rollout.engine_rev("vllm/vllm-openai:v0.12.0", "NixlConnector")
    assert a != rollout.engine_rev("vllm/vllm-openai:v0.11.0", "MooncakeConnector")
    assert len(a) == 10 and a.isalnum()


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
