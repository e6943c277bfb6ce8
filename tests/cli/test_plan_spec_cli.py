"""`xpyd plan --spec` and `--prefill-tp/--decode-tp`: the operator's handoff pre-flight, one line, before the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_cli.main import main
from xpyd_perf.cli import main as perf_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "DisaggregatedDeployment" in p.read_text())
REFUSED = "the operator would refuse it (Ready=False, HandoffIncompatible): prefill and decode cannot hand KV over"
B200_H200 = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}
NEWER = {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.35.0"}]}}


def _dd(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "engine": {"image": "vllm/vllm-openai:v0.34.0", "args": ["--max-model-len", "32768"]},
        "topology": {"kind": "HGX-B200"},
        "prefill": {"replicas": 1, "gpusPerReplica": 4, **(prefill or {})},
        "decode": {"replicas": 1, "gpusPerReplica": 4, **(decode or {})},
        **spec,
    }
    return {"apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment", "metadata": {"name": "dd"},
            "spec": body}  # fmt: skip


def _file(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "dd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# Each combination the operator refuses, and the words (the field) its one line must name.
@pytest.mark.parametrize(
    ("prefill", "decode", "words"),
    [
        ({"args": ["--block-size", "16"]}, {"args": ["--block-size", "128"]}, ["block size differs", "16", "128"]),
        ({"args": ["--kv-cache-dtype", "fp8"]}, {}, ["KV cache dtype differs", "prefill fp8, decode default"]),
        ({"args": ["--dtype", "float16"]}, {}, ["model dtype (--dtype) differs"]),
        ({}, {"args": ["--attention-backend", "FLASHINFER"]}, ["attention backend differs"]),
        ({"gpusPerReplica": 8}, {}, ["prefill tensor parallel 8 > decode tensor parallel 4"]),
        ({}, {"gpusPerReplica": 6}, ["decode tensor parallel 6 is not a multiple of prefill tensor parallel 4"]),
        ({"gpusPerReplica": 8, "tensorParallelSize": 4, "pipelineParallelSize": 2}, {},
         ["pipeline parallel size differs", "use pipelineParallelSize 1"]),
        ({}, {"podTemplatePatch": B200_H200}, ["GPU type differs", "NVIDIA-B200", "NVIDIA-H200"]),
        ({}, {"podTemplatePatch": NEWER}, ["engine image differs"]),
    ],
)  # fmt: skip
def test_an_incompatible_spec_is_refused_in_one_line_naming_the_field(
    prefill: dict[str, Any], decode: dict[str, Any], words: list[str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = _file(tmp_path, _dd(prefill, decode))
    assert main(["plan", "--spec", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"xpyd plan: error: --spec {path}: dd: {REFUSED}: ")
    for word in words:
        assert word in err
    # xpyd render refuses it with the same message
    assert main(["render", path]) == 2
    assert err.split(f"--spec {path}: ", 1)[1] in capsys.readouterr().err


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_example_is_accepted(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--spec", str(example)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    doc = next(d for d in yaml.safe_load_all(example.read_text()) if d and d.get("kind") == "DisaggregatedDeployment")
    name, colocated = doc["metadata"]["name"], doc["spec"].get("mode") == "Colocated"
    assert first.startswith(f"handoff: none ({name}: Colocated" if colocated else f"handoff: compatible ({name}: ")


def test_the_spec_stands_in_for_the_model_topology_and_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _dd(topology={"kind": "GB200-NVL72"}, engine={"args": ["--max-model-len", "16384"]})
    path = _file(tmp_path, doc)
    assert main(["plan", "--spec", path, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["model"], got["topology"], got["gpus_per_replica"]) == ("llama-3.1-70b", "GB200-NVL72", 4)
    assert got["handoff"]["compatible"] is True and got["handoff"]["prefill"]["tp"] == 4
    assert got["handoff"]["line"].startswith("handoff: compatible (dd: prefill and decode vllm 0.34.0")
    assert "16384-token sequence" in got["fit"]["summary"]  # the engine's --max-model-len
    # the command line still wins
    assert main(["plan", "--spec", path, "--topology", "HGX-B200", "--gpus-per-replica", "8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["topology"], got["gpus_per_replica"]) == ("HGX-B200", 8)


@pytest.mark.parametrize(
    ("argv", "rc", "says"),
    [
        (["--prefill-tp", "4", "--decode-tp", "8"], 0, "handoff: compatible (--prefill-tp/--decode-tp: prefill vllm"),
        (["--prefill-tp", "8", "--decode-tp", "4"], 2, "prefill tensor parallel 8 > decode tensor parallel 4"),
        (["--prefill-tp", "2", "--decode-tp", "3"], 2, "decode tensor parallel 3 is not a multiple"),
        (["--prefill-tp", "2"], 2, "--prefill-tp and --decode-tp go together without --spec"),
        (["--prefill-tp", "0", "--decode-tp", "4"], 2, "--prefill-tp must be at least 1, got 0"),
    ],
)
def test_tensor_parallel_alone(argv: list[str], rc: int, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-70b", *argv]) == rc
    out, err = capsys.readouterr()
    assert says in (out.splitlines()[0] if rc == 0 else err)
    if rc:
        assert err.count("\n") == 1 and err.startswith("xpyd plan: error: ")


def test_tensor_parallel_overrides_a_specs_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, _dd())
    assert main(["plan", "--spec", path, "--decode-tp", "2"]) == 2
    assert "prefill tensor parallel 4 > decode tensor parallel 2" in capsys.readouterr().err
    assert main(["plan", "--spec", path, "--decode-tp", "8"]) == 0
    assert "TP4 x PP1" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("kind: Namespace\napiVersion: v1\nmetadata: {name: x}\n", "no DisaggregatedDeployment in the file"),
        ("a: [1\n", "not valid YAML at line"),
        (yaml.safe_dump_all([_dd(), {**_dd(), "metadata": {"name": "other"}}]), "holds 2 DisaggregatedDeployments"),
        (yaml.safe_dump({**_dd(), "spec": {"model": {}}}), "dd: spec.model.name"),
    ],
)
def test_a_spec_that_cannot_be_read_is_one_line(
    doc: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dd.yaml").write_text(doc)
    assert main(["plan", "--spec", str(tmp_path / "dd.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_the_perf_package_alone_says_who_reads_a_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert perf_main(["--model", "llama-3.1-8b", "--spec", "dd.yaml"]) == 2
    assert "read by the xpyd command" in capsys.readouterr().err
