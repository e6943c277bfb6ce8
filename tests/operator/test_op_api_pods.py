"""The API's real-cluster fields: defaults, the rules they are held to, and their CRD schema (CEL mirrors)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from xpyd_api import crdgen, fabrics
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_api.podmodels import NetworkSpec

BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


def _spec(**patch: Any) -> DisaggregatedDeploymentSpec:
    return DisaggregatedDeploymentSpec.model_validate({**BASE, **patch})


def test_defaults() -> None:
    s = _spec()
    assert (s.model.token_secret, s.model.cache, s.network, s.pod_template_patch) == (None, None, None, None)
    assert (s.engine.service_account_name, s.engine.shared_memory_size) == (None, None)
    assert s.scheduling.node_selector == {} and s.scheduling.tolerations == []
    assert s.prefill is not None
    assert (s.prefill.data_parallel_size, s.prefill.expert_parallel, s.prefill.world_size) == (1, False, 1)


@pytest.mark.parametrize(
    ("pool", "tp", "world"),
    [({"gpusPerReplica": 8}, 8, 8), ({"gpusPerReplica": 8, "dataParallelSize": 8}, 1, 8),
     ({"gpusPerReplica": 8, "dataParallelSize": 2}, 4, 8), ({"gpusPerReplica": 0, "dataParallelSize": 2}, 1, 2)],
)  # fmt: skip
def test_tensor_parallel_defaults_to_the_gpus_over_data_parallel(pool: dict[str, Any], tp: int, world: int) -> None:
    s = _spec(decode=pool)
    assert s.decode is not None
    assert (s.decode.tp, s.decode.world_size) == (tp, world)


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"decode": {"gpusPerReplica": 8, "tensorParallelSize": 4}}, "(4 x 1 x 1) is the engine's world size"),
        ({"decode": {"gpusPerReplica": 8, "dataParallelSize": 3}}, "x pipelineParallelSize (3)"),
        ({"model": {"name": "m", "cache": {}}}, "exactly one of persistentVolumeClaim"),
        ({"model": {"name": "m", "cache": {"hostPath": {"path": "/a"}, "emptyDir": {}}}}, "exactly one of"),
        ({"model": {"name": "m", "cache": {"hostPath": {"path": "relative"}}}}, "should match pattern"),
        ({"model": {"name": "m", "tokenSecret": {"name": "t", "key": "k"}},
          "engine": {"env": [{"name": "HF_TOKEN", "value": "x"}]}}, "HF_TOKEN is set twice"),
        ({"network": {"profile": "Slingshot"}}, "network.profile must be one of None, InfiniBand"),
        ({"network": {"profile": "None", "env": {"A": "b"}}}, "takes no additions; use Custom"),
        ({"network": {"profile": "Custom", "capabilities": ["CAP_IPC_LOCK", "ALL"]}}, "without CAP_"),
        ({"network": {"profile": "Custom", "resources": {"rdma/ib": "lots"}}}, "quantities such as"),
        ({"engine": {"sharedMemorySize": "huge"}}, "should match pattern"),
        ({"scheduling": {"affinity": {"nodeAfinity": {}}}}, "unknown: ['nodeAfinity']"),
        ({"scheduling": {"tolerations": [{"effect": "Sometimes"}]}}, "NoSchedule"),
        ({"podTemplatePatch": {"spec": {"tolerationz": []}}}, "did you mean tolerations?"),
    ],
)  # fmt: skip
def test_bad_real_cluster_fields_name_the_problem(patch: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        _spec(**patch)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("text", "profile"),
    [("", None), ("  ", None), ("InfiniBand", "InfiniBand"), ('{"profile": "RoCE", "devicesPerGpu": 2}', "RoCE")],
)
def test_network_default_parses_a_name_or_json(text: str, profile: str | None) -> None:
    got = NetworkSpec.parse(text)
    assert (got.profile if got else None) == profile


@pytest.mark.parametrize(
    ("text", "problem"),
    [("Slingshot", "must be one of"), ('{"profile": "None", "env": {"A": "1"}}', "use Custom"), ("{not json", "JSON")],
)
def test_network_default_refuses_nonsense(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        NetworkSpec.parse(text)


def _crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load(crdgen.render())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_crd_mirrors_the_rules_in_cel() -> None:
    spec = _crd_spec()["properties"]
    pool_rules = " ".join(r["rule"] for r in spec["prefill"]["x-kubernetes-validations"])
    assert "self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize == self.gpusPerReplica" in (
        pool_rules
    )
    assert "self.gpusPerReplica % (self.dataParallelSize * self.pipelineParallelSize) == 0" in pool_rules
    for field in ("dataParallelSize", "pipelineParallelSize"):
        assert spec["prefill"]["properties"][field]["default"] == 1, f"the CEL rules read {field} unset"
    layout_rules = " ".join(r["rule"] for r in _crd_spec()["x-kubernetes-validations"])
    assert "self.prefill.gpusPerReplica <= 8 || self.prefill.gpusPerReplica % 8 == 0" in layout_rules
    assert "self.decode.gpusPerReplica <= 72" in layout_rules
    cache = spec["model"]["properties"]["cache"]
    assert "has(self.persistentVolumeClaim)" in cache["x-kubernetes-validations"][0]["rule"]
    network = spec["network"]
    assert network["properties"]["profile"]["enum"] == list(fabrics.PROFILES)
    assert "self.profile != 'None'" in network["x-kubernetes-validations"][0]["rule"]


@pytest.mark.parametrize("path", [("podTemplatePatch",), ("prefill", "podTemplatePatch"), ("scheduling", "affinity")])
def test_free_form_fields_keep_what_the_user_wrote(path: tuple[str, ...]) -> None:
    node = _crd_spec()
    for key in path:
        node = node["properties"][key]
    assert node["type"] == "object"
    assert node["x-kubernetes-preserve-unknown-fields"] is True
