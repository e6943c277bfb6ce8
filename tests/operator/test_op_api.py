"""The API models, their cross-field rules and the generated CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from xpyd_api import conditions as C
from xpyd_api import crdgen
from xpyd_api.models import DisaggregatedDeploymentSpec

BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


def test_defaults_fill_engine_topology_router() -> None:
    spec = DisaggregatedDeploymentSpec.model_validate(BASE)
    assert (spec.engine.kind, spec.engine.kv_connector, spec.topology.kind) == (
        "vllm",
        "NixlConnector",
        "Any",
    )
    assert (spec.mode, spec.router.policy, spec.router.replicas) == ("Disaggregated", "kv-aware", 1)
    assert spec.prefill is not None
    assert spec.prefill.tp == 1


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"mode": "Colocated"}, "Colocated mode takes exactly one pool"),
        ({"decode": None}, "Disaggregated mode takes spec.prefill and spec.decode"),
        ({"worker": {"replicas": 1}}, "Disaggregated mode takes"),
        ({"topology": {"kind": "HGX-B200"}, "prefill": {"gpusPerReplica": 12}}, "multiple of 8 on HGX-B200"),
        ({"topology": {"kind": "GB200-NVL72"}, "prefill": {"gpusPerReplica": 6}}, "multiple of 4 on GB200-NVL72"),
        ({"topology": {"kind": "GB200-NVL72"}, "prefill": {"gpusPerReplica": 76}}, "must be <= 72 on GB200-NVL72"),
        (
            {"topology": {"kind": "HGX-B200"}, "prefill": {"gpusPerReplica": 32, "dataParallelSize": 2}},
            "a data-parallel rank never spans nodes",
        ),
        ({"prefill": {"gpusPerReplica": 8, "dataParallelSize": 2, "pipelineParallelSize": 2}}, "cannot both"),
        ({"prefill": {"gpusPerReplica": 8, "pipelineParallelSize": 3}}, "multiple of dataParallelSize x pipeline"),
        ({"prefill": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas (5) must be <="),
        ({"prefill": {"replicas": 9, "autoscaling": {"maxReplicas": 4}}}, "within autoscaling bounds"),
        ({"engine": {"kind": "tgi"}}, "Input should be 'vllm', 'sglang' or 'emulator'"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_specs_name_the_problem(patch: dict[str, Any], needle: str) -> None:
    body = {**BASE, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ValidationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        DisaggregatedDeploymentSpec.model_validate(body)


def test_colocated_takes_worker() -> None:
    spec = DisaggregatedDeploymentSpec.model_validate(
        {"model": BASE["model"], "mode": "Colocated", "worker": {"replicas": 3}}
    )
    assert list(spec.pools()) == ["worker"]


def test_committed_crd_is_current() -> None:
    committed = crdgen.DEFAULT_DIR / crdgen.CRD_FILE
    assert committed.read_text() == crdgen.render(), "run: python -m xpyd_api.crdgen"


def test_crdgen_check_flags_a_stale_file(tmp_path: Path) -> None:
    (tmp_path / crdgen.CRD_FILE).write_text("stale\n")
    assert crdgen.main(["--out-dir", str(tmp_path), "--check"]) == 1
    assert crdgen.main(["--out-dir", str(tmp_path)]) == 0
    assert crdgen.main(["--out-dir", str(tmp_path), "--check"]) == 0


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.get("properties", {}).items():
            out += _walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
    return out


def test_crd_schema_is_structural() -> None:
    crd = yaml.safe_load(crdgen.render())
    version = crd["spec"]["versions"][0]
    for path, node in _walk(version["schema"]["openAPIV3Schema"]):
        assert "type" in node, f"{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "title"} & set(node), f"{path} is not structural"
        assert not ("properties" in node and "additionalProperties" in node), path
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["dd", "xpyd"]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["XPYD", "Ready", "Topology", "Layout", "Age"]


def test_crd_carries_cel_rules_with_field_paths() -> None:
    spec = yaml.safe_load(crdgen.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = " ".join(r["rule"] for r in spec["x-kubernetes-validations"])
    for rule in ("self.prefill.gpusPerReplica <= 8", "!has(self.decode)"):
        assert rule in rules
    scaling = spec["properties"]["prefill"]["properties"]["autoscaling"]["x-kubernetes-validations"]
    assert scaling[0]["rule"] == "self.minReplicas <= self.maxReplicas"
    paths = {r.get("fieldPath") for r in spec["x-kubernetes-validations"]}
    assert {".decode", ".prefill.gpusPerReplica", ".worker"} <= paths
    assert "replicas" not in spec["properties"]["prefill"].get("required", [])
    assert "default" not in spec["properties"]["prefill"]["properties"]["replicas"]


@pytest.mark.parametrize(
    ("old_status", "new_status", "keeps_time"),
    [("True", "True", True), ("True", "False", False), ("False", "Unknown", False)],
)
def test_condition_time_moves_only_on_flip(old_status: str, new_status: str, keeps_time: bool) -> None:
    old = C.merge([], [C.make(C.READY, old_status, "A")], "2026-01-01T00:00:00Z", C.RECONCILER_TYPES)  # type: ignore[arg-type]
    new = C.merge(old, [C.make(C.READY, new_status, "B", "m", 7)], "2026-02-02T00:00:00Z", C.RECONCILER_TYPES)  # type: ignore[arg-type]
    assert (new[0].last_transition_time == "2026-01-01T00:00:00Z") is keeps_time
    assert new[0].observed_generation == 7


def test_merge_keeps_conditions_it_does_not_own() -> None:
    theirs = C.merge([], [C.make(C.AUTOSCALER_HEALTHY, True, "Ok")], "t0", ())
    out = C.merge(theirs, [C.make(C.READY, True, "Ok")], "t1", C.RECONCILER_TYPES)
    assert {c.type for c in out} == {C.READY, C.AUTOSCALER_HEALTHY}
