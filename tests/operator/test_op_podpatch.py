"""Pod template patches: checked when the spec is read, merged like a strategic merge patch, applied last."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]
from pydantic import ValidationError

from xpyd_api import engines, handoff, podpatch
from xpyd_api import labels as L
from xpyd_operator import rollout
from xpyd_operator.desired import build_children
from xpyd_operator.placement import Demand, place
from xpyd_perf import TOPOLOGIES

IMG = "ghcr.io/xpyd/xpyd:test"
ENGINE = {"name": "engine"}


@pytest.mark.parametrize(
    "patch",
    [
        {},
        {"metadata": {"labels": {"team": "llm"}, "annotations": {"a": "b"}}},
        {"spec": {"hostIPC": True, "containers": [{**ENGINE, "env": [{"name": "X", "value": "1"}]}]}},
        {"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}},
        {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}], "nodeSelector": None}},
        {"spec": {"initContainers": [{"name": "fetch", "image": "alpine", "command": ["true"]}]}},
    ],
)
def test_patches_that_apply(patch: dict[str, Any]) -> None:
    assert podpatch.check(patch) == []


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        ([], "must be a mapping"),
        ({"kind": "Pod"}, "podTemplatePatch.kind is not allowed"),
        ({"metadata": {"name": "x"}}, "only labels and annotations"),
        ({"metadata": {"labels": {"xpyd.io/role": "decode"}}}, "are the operator's"),
        ({"metadata": {"labels": {"a": 1}}}, "map names to strings"),
        ({"spec": {"nodeSelecter": {}}}, "nodeSelecter is not a pod spec field (did you mean nodeSelector?)"),
        ({"spec": {"restartPolicy": "Never"}}, "not allowed in a StatefulSet's pods"),
        ({"spec": {"containers": {"name": "engine"}}}, "must be a list"),
        ({"spec": {"containers": [{"image": "x"}]}}, "mappings with a name"),
        ({"spec": {"containers": [{**ENGINE, "$patch": "delete"}]}}, "engine container cannot be deleted"),
        ({"spec": {"containers": [{"name": "sidecar"}]}}, "a new container needs an image"),
        ({"spec": {"containers": [{**ENGINE, "envv": []}]}}, "envv is not a container field (did you mean env?)"),
    ],
)
def test_patches_that_do_not_apply_name_the_problem(patch: Any, problem: str) -> None:
    assert any(problem in e for e in podpatch.check(patch)), podpatch.check(patch)


@pytest.mark.parametrize(
    ("base", "patch", "want"),
    [
        ({"a": 1, "b": 2}, {"b": None, "c": 3}, {"a": 1, "c": 3}),
        ({"m": {"x": 1, "y": 2}}, {"m": {"y": 3}}, {"m": {"x": 1, "y": 3}}),
        ({"m": {"x": 1, "y": 2}}, {"m": {"$patch": "replace", "z": 1}}, {"m": {"z": 1}}),
        ({"m": {"x": 1}}, {"m": {"$patch": "delete"}}, {}),
        ({"tolerations": [{"key": "a"}]}, {"tolerations": [{"key": "b"}]}, {"tolerations": [{"key": "b"}]}),
        (
            {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}, {"name": "A", "$patch": "delete"}]},
            {"env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
        ),
        (
            {"volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]},
            {"volumeMounts": [{"name": "big", "mountPath": "/dev/shm"}]},
            {"volumeMounts": [{"name": "big", "mountPath": "/dev/shm"}]},
        ),
        (
            {"containers": [{"name": "engine", "env": [{"name": "A", "value": "1"}], "image": "v1"}]},
            {"containers": [{"name": "engine", "env": [{"name": "Z", "value": "9"}]}]},
            {"containers": [{"name": "engine", "env": [{"name": "A", "value": "1"}, {"name": "Z", "value": "9"}],
                             "image": "v1"}]},
        ),
    ],
)  # fmt: skip
def test_merge(base: dict[str, Any], patch: dict[str, Any], want: dict[str, Any]) -> None:
    before = repr(base)
    assert podpatch.merge(base, patch) == want
    assert repr(base) == before, "merge must not change its input"


def _children(**overrides: Any) -> dict[str, dict[str, Any]]:
    """Workloads by name."""
    s = spec(**overrides)
    demands = [Demand(role, p.replicas or 1, p.gpus_per_replica, p.tp) for role, p in s.pools().items()]
    children = build_children(OWNER, s, place(TOPOLOGIES["HGX-B200"], demands), False, IMG, IMG, ("regcred",))
    return {c["metadata"]["name"]: c for c in children if c["kind"] in {"StatefulSet", "Deployment"}}


def test_the_spec_wide_patch_then_the_pools_apply_last() -> None:
    everywhere = {
        "spec": {
            "hostIPC": True,
            "imagePullSecrets": [{"name": "regcred", "$patch": "delete"}],
            "containers": [{**ENGINE, "env": [{"name": "A", "value": "all"}]}],
        }
    }
    decode_only = {
        "metadata": {"labels": {"tier": "decode"}},
        "spec": {"containers": [{**ENGINE, "env": [{"name": "A", "value": "decode"}]}]},
    }
    children = _children(podTemplatePatch=everywhere, decode={"replicas": 1, "gpusPerReplica": 8,
                                                              "podTemplatePatch": decode_only})  # fmt: skip
    for role, value in (("prefill", "all"), ("decode", "decode")):
        template = children[f"llama-{role}"]["spec"]["template"]
        pod = template["spec"]
        assert pod["hostIPC"] is True
        assert pod.get("imagePullSecrets", []) == [], "the patch runs after the pull secrets are added"
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["A"] == value
        assert env[L.ENV_ROLE] == role, "generated env stays"
        assert (template["metadata"]["labels"].get("tier") == "decode") is (role == "decode")
    assert children["llama-router"]["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_a_patched_engine_image_moves_the_engine_revision() -> None:
    patch = {"spec": {"containers": [{**ENGINE, "image": "vllm/vllm-openai:v0.12.0"}]}}
    children = _children(decode={"replicas": 1, "gpusPerReplica": 8, "podTemplatePatch": patch})
    labels = {
        role: children[f"llama-{role}"]["spec"]["template"]["metadata"]["labels"] for role in ("prefill", "decode")
    }
    s = spec(decode={"replicas": 1, "gpusPerReplica": 8, "podTemplatePatch": patch})
    decode = handoff.pool_facts(s, s.pools()["decode"])
    prefill = handoff.pool_facts(s, s.pools()["prefill"])
    assert decode.image == "vllm/vllm-openai:v0.12.0"
    assert labels["decode"][L.ENGINE_REV] == rollout.engine_rev("vllm/vllm-openai:v0.12.0", "NixlConnector", decode)
    assert labels["prefill"][L.ENGINE_REV] == rollout.engine_rev(
        engines.default_image("vllm"), "NixlConnector", prefill
    )
    assert labels["decode"][L.ENGINE_REV] != labels["prefill"][L.ENGINE_REV]
    assert "engine image differs" in (handoff.check(s) or ""), "the pre-flight check refuses the mixed pair"


@pytest.mark.parametrize("where", ["spec", "pool"])
def test_a_bad_patch_is_refused_when_the_spec_is_read(where: str) -> None:
    bad = {"spec": {"containers": [{**ENGINE, "$patch": "delete"}]}}
    body: dict[str, Any] = (
        {"podTemplatePatch": bad} if where == "spec" else {"decode": {"replicas": 1, "podTemplatePatch": bad}}
    )
    with pytest.raises(ValidationError, match="the engine container cannot be deleted"):
        spec(**body)
