"""Every manifest under examples/ is a commented, valid DisaggregatedDeployment (the CRD's own models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeployment

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
# Public reference deployments reproduced as DisaggregatedDeployments (tests/examples/test_reference_pods.py).
REFERENCE_EXAMPLES = (
    "llama-70b-hgx-b200.yaml",
    "deepseek-r1-wide-ep-hgx-b200.yaml",
    "deepseek-r1-gb200-nvl72.yaml",
)


def _deployments(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d.get("kind") == L.KIND]


def _all() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in EXAMPLES for doc in _deployments(path)]


def test_the_promised_examples_exist() -> None:
    names = {p.relative_to(REPO / "examples").as_posix() for p in EXAMPLES}
    assert set(REFERENCE_EXAMPLES) | {"colocated-h100.yaml"} <= names
    assert {"demo/hgx-b200-emulated.yaml", "demo/gb200-nvl72-emulated.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_commented(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# "), f"{path.name} must open with a comment saying what it deploys"


@pytest.mark.parametrize(("path", "doc"), _all(), ids=lambda v: getattr(v, "name", ""))
def test_example_validates_against_the_api(path: Path, doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == f"{L.GROUP}/{L.VERSION}"
    model = DisaggregatedDeployment.model_validate(doc)
    assert len(doc["metadata"]["name"]) <= 40
    if doc["kind"] == "DisaggregatedDeployment" and not {"demo", "kind"} & set(path.parts):  # `apply -n TEAM` works
        assert "namespace" not in doc["metadata"], f"{path.name} pins a namespace"
    topology = model.spec.topology.hardware
    for role, pool in model.spec.pools().items():
        if topology is not None:  # one node, or whole nodes (a LeaderWorkerSet group) inside one NVLink domain
            per_node = topology.gpus_per_node
            whole = pool.gpus_per_replica <= per_node or pool.gpus_per_replica % per_node == 0
            assert whole, f"{path.name}: {role} replica must fit one node or take whole nodes"
            assert pool.gpus_per_replica <= topology.max_replica_gpus or topology.nvlink_domain == "node"
        if pool.autoscaling and pool.replicas is not None:
            assert pool.autoscaling.min_replicas <= pool.replicas <= pool.autoscaling.max_replicas


@pytest.mark.parametrize(
    ("name", "topology", "mode"),
    [
        ("llama-70b-hgx-b200.yaml", "HGX-B200", "Disaggregated"),
        ("deepseek-r1-wide-ep-hgx-b200.yaml", "HGX-B200", "Disaggregated"),
        ("deepseek-r1-gb200-nvl72.yaml", "GB200-NVL72", "Disaggregated"),
        ("colocated-h100.yaml", "Any", "Colocated"),
        ("demo/hgx-b200-emulated.yaml", "HGX-B200", "Disaggregated"),
        ("demo/gb200-nvl72-emulated.yaml", "GB200-NVL72", "Disaggregated"),
    ],
)
def test_example_shape(name: str, topology: str, mode: str) -> None:
    (doc,) = _deployments(REPO / "examples" / name)
    spec = DisaggregatedDeployment.model_validate(doc).spec
    assert spec.topology.kind == topology
    assert spec.mode == mode
    assert (spec.engine.kind == "emulator") is name.startswith("demo/")


def test_nvl72_example_fits_one_clique_at_its_maxima() -> None:
    (doc,) = _deployments(REPO / "examples" / "deepseek-r1-gb200-nvl72.yaml")
    spec = DisaggregatedDeployment.model_validate(doc).spec
    gpus = 0
    for pool in spec.pools().values():
        assert pool.autoscaling is not None
        gpus += pool.autoscaling.max_replicas * pool.gpus_per_replica
    assert gpus <= 72


def test_demo_namespace_is_created_with_the_demo() -> None:
    demo = REPO / "examples" / "demo"
    namespaces = {
        d["metadata"]["name"]
        for p in demo.glob("*.yaml")
        for d in yaml.safe_load_all(p.read_text())
        if d
        if d.get("kind") == "Namespace"
    }
    used = {doc["metadata"]["namespace"] for path, doc in _all() if path.parent == demo}
    assert used <= namespaces
