"""docs/install.md and docs/troubleshooting.md say what the code does: the real minimum Kubernetes
version, a check for every prerequisite, a kind block that works as pasted, the printer columns,
the startup-probe budget."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api import labels as L
from xpyd_api.crdgen import render
from xpyd_api.models import AutoscalingSpec, DisaggregatedDeployment, DisaggregatedDeploymentSpec
from xpyd_operator import pools
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.meta import Owner
from xpyd_perf.topology import TOPOLOGIES

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INSTALL = (DOCS / "install.md").read_text()
TROUBLE = (DOCS / "troubleshooting.md").read_text()
CRD = yaml.safe_load(render())
CHART = yaml.safe_load((REPO / "charts" / "xpyd-operator" / "Chart.yaml").read_text())

# The Kubernetes release from which the API server accepts each CRD feature (enabled by default).
# A feature the CRD starts to use and this table does not know fails the test: decide its floor.
RULE_FIELDS = {"rule": (1, 25), "message": (1, 25), "messageExpression": (1, 27)}
RULE_FIELDS |= {"fieldPath": (1, 28), "reason": (1, 28)}  # KEP-2876, kubernetes/kubernetes#118041
VERSION_FIELDS = {"selectableFields": (1, 31)}


def _rules(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [r for item in node for r in _rules(item)]
    if not isinstance(node, dict):
        return []
    found = list(node.get("x-kubernetes-validations") or [])
    return found + [r for key, value in node.items() if key != "x-kubernetes-validations" for r in _rules(value)]


def crd_minimum() -> tuple[int, int]:
    """The oldest Kubernetes whose API server accepts the CRD as generated."""
    floor = (1, 16)  # apiextensions.k8s.io/v1
    for rule in _rules(CRD):
        unknown = set(rule) - set(RULE_FIELDS)
        assert not unknown, f"CEL rule fields {unknown}: add their Kubernetes version to RULE_FIELDS"
        floor = max([floor, *(RULE_FIELDS[k] for k in rule)])
    for version in CRD["spec"]["versions"]:
        floor = max([floor, *(v for k, v in VERSION_FIELDS.items() if k in version)])
    return floor


def test_the_crd_needs_1_28_for_field_paths() -> None:
    assert crd_minimum() == (1, 28)


def test_documented_minimum_is_what_the_crd_needs_and_the_chart_enforces() -> None:
    documented = re.search(r"\| 1 \| Kubernetes (\d+)\.(\d+) or newer \|", INSTALL)
    assert documented, "prerequisite 1 names the minimum Kubernetes version"
    assert (int(documented[1]), int(documented[2])) == crd_minimum()
    floor = re.fullmatch(r">=(\d+)\.(\d+)\.0-0", CHART["kubeVersion"])
    assert floor and (int(floor[1]), int(floor[2])) == crd_minimum()
    assert f'`kubeVersion: "{CHART["kubeVersion"]}"`' in INSTALL


def _table_after(text: str, marker: str) -> list[list[str]]:
    lines = text.split(f"<!-- {marker}", 1)[1].splitlines()[1:]
    rows = lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))] for row in rows[2:]]


PREREQUISITES = _table_after(INSTALL, "prerequisites")


@pytest.mark.parametrize("row", PREREQUISITES, ids=lambda r: r[0])
def test_every_prerequisite_has_a_check_command(row: list[str]) -> None:
    _, what, needed_for, check, expect = row
    assert what and needed_for and expect
    commands = re.findall(r"`([^`]+)`", check)
    assert commands and all(c.split()[0] in {"kubectl", "helm"} for c in commands), check


@pytest.mark.parametrize(
    "words",
    [
        "GPU Operator", L.GPU_PRODUCT, L.GPU_CLIQUE, L.GPU_COUNT, "kube-prometheus-stack", "DynamicResourceAllocation",
        "NVIDIA DRA Driver for GPUs v", "RDMA device plugin", "LeaderWorkerSet", "Pod Security",
    ],
)  # fmt: skip
def test_prerequisites_name_every_component(words: str) -> None:
    table = "\n".join(" | ".join(row) for row in PREREQUISITES)
    assert words in table


def _prometheus_urls(node: Any) -> list[str]:
    """Every `prometheusUrl` under an `autoscaling` mapping of a manifest (the spec's and the pools')."""
    if isinstance(node, list):
        return [u for item in node for u in _prometheus_urls(item)]
    if not isinstance(node, dict):
        return []
    own = node.get("autoscaling")
    urls = [own["prometheusUrl"]] if isinstance(own, dict) and "prometheusUrl" in own else []
    return urls + [u for value in node.values() for u in _prometheus_urls(value)]


def _readme_spec() -> dict[str, Any]:
    readme = (REPO / "README.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL) if f"kind: {L.KIND}" in b]
    assert len(blocks) == 1, "README.md's spec"
    spec = yaml.safe_load(blocks[0])
    assert isinstance(spec, dict)
    return spec


# The Prometheus URLs of the top-level examples that set one (examples/demo/ points at the local cluster's
# own Prometheus on loopback, not at the one install.md sets up)
EXAMPLE_PROMETHEUS = {
    p.relative_to(REPO).as_posix(): urls
    for p in sorted([*(REPO / "examples").glob("*.yaml"), *(REPO / "examples" / "kind").glob("*.yaml")])
    if (urls := _prometheus_urls([d for d in yaml.safe_load_all(p.read_text()) if d]))
}


def test_prometheus_url_of_the_stack_is_what_the_examples_use() -> None:
    """install.md's Prometheus URL is the model's default and the one README.md's spec, configure.md and
    every example that sets one use: copying any of them reaches the Prometheus install.md sets up."""
    url = re.search(r"Prometheus is then `(http://[^`]+)`", INSTALL)
    assert url
    assert AutoscalingSpec().prometheus_url == url[1], "the model's default"
    assert _prometheus_urls(_readme_spec()) == [url[1]]
    row = re.search(
        r"^\| `spec\.autoscaling\.prometheusUrl` \| `([^`]+)` \|", (DOCS / "configure.md").read_text(), re.M
    )
    assert row and row[1] == url[1], "configure.md's default"
    assert {"examples/kind/hgx-b200-kind.yaml", "examples/llama-70b-hgx-b200.yaml"} <= set(EXAMPLE_PROMETHEUS)
    assert {name: urls for name, urls in EXAMPLE_PROMETHEUS.items() if set(urls) != {url[1]}} == {}


def _block_after(text: str, marker: str) -> str:
    return text.split(f"<!-- {marker}", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


def test_kind_block_works_as_pasted() -> None:
    block = _block_after(INSTALL, "kind-block")
    image = f"{L.OWN_IMAGE}:{CHART['appVersion']}"
    assert f"docker build -t {image} ." in block
    assert f"kind load docker-image {image} --name xpyd" in block
    hgx = TOPOLOGIES["HGX-B200"]
    assert f"{L.GPU_PRODUCT}={hgx.product}" in block
    assert L.GPU_RESOURCE.replace("/", "~1") in block, "the node gets GPUs as an extended resource"
    applied = re.search(r"kubectl apply -f (\S+)", block)
    waited = re.search(r"kubectl -n (\S+) wait dd/(\S+) --for=condition=Ready", block)
    assert applied and waited
    docs = [d for p in sorted((REPO / applied[1]).glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    assert namespace["metadata"]["name"] == waited[1]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    dd = DisaggregatedDeployment.model_validate(next(d for d in docs if d["kind"] == L.KIND))
    assert (dd.metadata["namespace"], dd.metadata["name"]) == (waited[1], waited[2])
    assert dd.spec.engine.kind == "emulator", "kind nodes have no GPUs to run vLLM"
    assert dd.spec.topology.kind == "HGX-B200"
    gpus = sum((p.replicas or 1) * p.gpus_per_replica for p in dd.spec.pools().values())
    assert gpus <= hgx.gpus_per_node, "everything fits the one node's 8 fake GPUs"


def _startup_budget(spec: dict[str, Any]) -> tuple[int, int]:
    """The startup probe the operator builds (sized from the model's weights) for a spec's decode pods."""
    s = DisaggregatedDeploymentSpec.model_validate(spec)
    assert s.decode is not None
    template = pools.pod_template(PoolBuild(Owner("x", "ns", "uid"), s, "decode", "img"))
    probe = template["spec"]["containers"][0]["startupProbe"]
    return int(probe["periodSeconds"]), int(probe["failureThreshold"])


def test_startup_probe_budget_is_documented_as_built() -> None:
    period, failures = _startup_budget({"model": {"name": "acme/outside-the-catalog"}, "prefill": {}, "decode": {}})
    minutes = period * failures // 60
    assert f"has {minutes} minutes (startup probe `GET /health` every {period} s, {failures} failures)" in TROUBLE
    (example,) = yaml.safe_load_all((REPO / "examples" / "llama-70b-hgx-b200.yaml").read_text())
    period, failures = _startup_budget(example["spec"])
    assert f"the engine pods' startup probe\nallows {period * failures // 60} minutes" in INSTALL


SECTIONS = TROUBLE.split("\n## ")[1:]


def test_troubleshooting_covers_what_users_hit() -> None:
    titles = " ".join(s.splitlines()[0].lower() for s in SECTIONS)
    for topic in ("image", "pod security", "hugging face 401", "out of memory", "nccl or nixl", "startup probe"):
        assert topic in titles


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.splitlines()[0])
def test_each_problem_names_the_condition_or_event_that_shows_it(section: str) -> None:
    shows = re.search(r"\*\*Shows as:\*\*(.+?)\n\n", section, re.S)
    assert shows, "every section opens with what shows it"
    assert re.findall(r"`[^`]+`", shows[1])


@pytest.mark.parametrize("doc", ["operate.md", "install.md", "security.md"])
def test_troubleshooting_is_linked(doc: str) -> None:
    assert "(troubleshooting.md" in (DOCS / doc).read_text()


def _columns(wide: bool) -> list[str]:
    cols = CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    return ["NAME"] + [str(c["name"]).upper() for c in cols if wide or not c.get("priority")]


def _get_dd_blocks() -> list[tuple[str, str, str]]:
    out = []
    for path in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for command, header in re.findall(r"^\$ (kubectl get dd[^\n]*)\n([^\n]+)", path.read_text(), re.M):
            out.append((path.name, command, header))
    return out


def test_there_are_printed_tables_to_check() -> None:
    assert {wide for _, command, _ in _get_dd_blocks() for wide in ["-o wide" in command]} == {True, False}


@pytest.mark.parametrize(("doc", "command", "header"), _get_dd_blocks())
def test_printed_columns_are_the_crds(doc: str, command: str, header: str) -> None:
    assert header.split() == _columns("-o wide" in command), f"{doc}: {command}"
