"""`xpyd render`: the operator's own builders, printed like `helm template`, with no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_cli.main import COMMANDS, main
from xpyd_operator.desired import Observed, desire
from xpyd_operator.meta import Owner
from xpyd_operator.render import empty_cluster
from xpyd_perf import TOPOLOGIES

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama-70b-hgx-b200.yaml"


def _render(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["render", *argv]) == 0
    out = capsys.readouterr().out
    if "--output" in argv or "-o" in argv:
        return list(json.loads(out)["items"])
    return [d for d in yaml.safe_load_all(out) if d]


def _sts(objects: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role))


def test_render_is_an_xpyd_command() -> None:
    assert COMMANDS["render"][0] == "xpyd_operator.render"


def test_render_prints_what_the_reconciler_would_apply(capsys: pytest.CaptureFixture[str]) -> None:
    objects = _render(capsys, str(LLAMA), "--image", "xpyd:test")
    doc = yaml.safe_load(LLAMA.read_text())
    spec = DisaggregatedDeploymentSpec.model_validate(doc["spec"])
    owner = Owner("llama-70b", "default", "uid-1")
    nodes = empty_cluster(TOPOLOGIES["HGX-B200"], 24, 4, "unused")
    desired = desire(owner, spec, Observed(nodes=nodes), "xpyd:test", "xpyd:test")
    want = [{**c, "metadata": {k: v for k, v in c["metadata"].items() if k != "ownerReferences"}}
            for c in desired.children]  # fmt: skip
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [(c["kind"], c["metadata"]["name"]) for c in want]
    assert [o["spec"] for o in objects if "spec" in o] == [c["spec"] for c in want if "spec" in c]
    assert all("ownerReferences" not in o["metadata"] for o in objects)


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["-n", "llm"], lambda objs: {o["metadata"]["namespace"] for o in objs} == {"llm"}),
        (["--topology", "Any"], lambda objs: "nodeSelector" not in _sts(objs, "decode")["spec"]["template"]["spec"]),
        (["--image-pull-secret", "regcred"],
         lambda objs: _sts(objs, "prefill")["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]),
        (["-o", "json"], lambda objs: len(objs) == 12),
    ],
)  # fmt: skip
def test_render_flags(argv: list[str], check: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(_render(capsys, str(LLAMA), *argv))


def test_the_operators_default_network_applies_unless_the_spec_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(LLAMA.read_text())
    del doc["spec"]["network"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(doc))
    requests = _sts(_render(capsys, str(bare), "--default-network", "RoCE"), "decode")["spec"]["template"]["spec"]
    assert requests["containers"][0]["resources"]["requests"]["rdma/roce_gdr"] == "4"
    own = _sts(_render(capsys, str(LLAMA), "--default-network", "RoCE"), "decode")["spec"]["template"]["spec"]
    assert "rdma/roce_gdr" not in own["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize(("flag", "claims"), [([], True), (["--no-compute-domain"], False)])
def test_nvl72_with_and_without_the_dra_driver(
    flag: list[str], claims: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = _render(capsys, str(ROOT / "examples" / "deepseek-r1-gb200-nvl72.yaml"), "--clique", "uuid.3", *flag)
    assert any(o["kind"] == "ComputeDomain" for o in objects) is claims
    decode = next(o for o in objects if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"].endswith("decode"))
    lwt = decode["spec"]["leaderWorkerTemplate"]
    for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):  # every pod of a group: channel and clique
        pod = template["spec"]
        assert ("resourceClaims" in pod) is claims
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == ["uuid.3"]


def test_every_deployment_of_a_file_and_only_those(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = yaml.safe_load(LLAMA.read_text())
    second = json.loads(json.dumps(first))
    second["metadata"]["name"] = "llama-b"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
                                        first, second]))  # fmt: skip
    names = {o["metadata"]["name"] for o in _render(capsys, str(path)) if o["kind"] == "StatefulSet"}
    assert names == {"llama-70b-prefill", "llama-70b-decode", "llama-b-prefill", "llama-b-decode"}


def test_empty_cluster_holds_the_unit() -> None:
    racks = {n.labels["nvidia.com/gpu.clique"] for n in empty_cluster(TOPOLOGIES["GB200-NVL72"], 100, 4, "u.0")}
    assert racks == {"u.0", "u.1"}
    assert sum(n.gpus for n in empty_cluster(TOPOLOGIES["HGX-B200"], 20, 8, "x")) >= 20
    assert max(n.gpus for n in empty_cluster(None, 16, 16, "x")) == 16
