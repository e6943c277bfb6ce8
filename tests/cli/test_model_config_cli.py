"""`xpyd plan --model-config` and `xpyd render --model-config`: any model offline, as the operator sizes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_cli.main import main
from xpyd_operator import sizing
from xpyd_operator.desired import with_model_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "perf" / "data" / "model-configs"


def deployment(name: str, gpus: int, topology: str = "HGX-B200") -> dict[str, Any]:
    return {
        "apiVersion": "xpyd.io/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "any", "namespace": "llm"},
        "spec": {
            "model": {"name": name, "configMap": {"name": "model-config"}},
            "topology": {"kind": topology},
            "prefill": {"replicas": 1, "gpusPerReplica": gpus},
            "decode": {"replicas": 1, "gpusPerReplica": gpus},
        },
    }


@pytest.mark.parametrize(
    ("stem", "name", "gpus", "topology", "fits"),
    [
        ("google--gemma-2-9b-it", "google/gemma-2-9b-it", 1, "HGX-B200", True),
        ("mistralai--Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1", 1, "HGX-B200", True),
        ("google--gemma-3-27b-it", "google/gemma-3-27b-it", 2, "GB200-NVL72", True),
        ("meta-llama--Llama-3.1-70B-Instruct", "acme/llama-70b-finetune", 1, "HGX-B200", False),
        ("deepseek-ai--DeepSeek-V3", "acme/deepseek-v3-distill", 4, "GB200-NVL72", False),
    ],
)
def test_plan_and_render_agree_with_the_operator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stem: str, name: str, gpus: int, topology: str, fits: bool
) -> None:
    config = str(CONFIGS / f"{stem}.json")
    dd = tmp_path / "dd.yaml"
    dd.write_text(yaml.safe_dump(deployment(name, gpus, topology)), encoding="utf-8")
    argv = ["--model", name, "--model-config", config, "--topology", topology, "--gpus-per-replica", str(gpus)]
    code = main(["plan", *argv, "--json"])
    out = capsys.readouterr()
    plan = json.loads(out.out.splitlines()[0])["fit"]
    assert code == (0 if fits else 2)
    # The operator's own check on the same spec, with the ConfigMap's config.json read in.
    spec = DisaggregatedDeploymentSpec.model_validate(deployment(name, gpus, topology)["spec"])
    spec = with_model_config(spec, json.loads(Path(config).read_text(encoding="utf-8")))
    assert spec.decode is not None
    fit = sizing.replica_fit_of(spec, spec.decode)
    assert fit is not None
    assert plan == fit.as_dict()  # weights, KV cache and HBM per GPU, and the verdict
    assert fit.fits is fits
    rendered = main(["render", str(dd), "--model-config", config])
    out = capsys.readouterr()
    if fits:
        assert rendered == 0
        assert f"# decode: {fit.summary()}" in out.out
        assert f"{fit.kv_bytes_per_token} KV bytes/token" in out.out
    else:
        assert rendered == 2 and out.out == ""
        assert "ReplicaDoesNotFit" in out.err and fit.summary() in out.err


def test_plan_names_the_model_after_the_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(CONFIGS / "microsoft--Phi-3-mini-4k-instruct.json")
    assert main(["plan", "--model-config", config, "--gpus-per-replica", "1", "--prompt-tokens", "2048"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("phi-3-mini-4k-instruct on HGX-B200")  # its _name_or_path
    assert "393216" not in out and "replica: phi-3-mini-4k-instruct (8 GB of bf16 weights)" in out


def test_render_without_the_config_says_to_pass_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dd = tmp_path / "dd.yaml"
    dd.write_text(yaml.safe_dump(deployment("google/gemma-2-9b-it", 1)), encoding="utf-8")
    assert main(["render", str(dd)]) == 2
    err = capsys.readouterr().err
    assert "spec.model.configMap names ConfigMap 'model-config'" in err and "--model-config FILE" in err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, None),  # render: "... does not exist; check the path" (xpyd_cli.errors); plan: "No such file ..."
        ("{", "not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("[1, 2]", "a config.json is a JSON object, got list"),
        (json.dumps({"hidden_size": 4096, "num_hidden_layers": 2}), "missing key num_attention_heads"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_bad_config_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, says: str | None, command: str
) -> None:
    config = tmp_path / "config.json"
    if content is not None:
        config.write_text(content, encoding="utf-8")
    dd = tmp_path / "dd.yaml"
    dd.write_text(yaml.safe_dump(deployment("acme/any", 1)), encoding="utf-8")
    head = [str(dd)] if command == "render" else ["--model", "acme/any"]
    run = subprocess.run(
        [sys.executable, "-m", "xpyd_cli.main", command, *head, "--model-config", str(config)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert str(config) in lines[0]
    if says is None:
        assert "does not exist" in lines[0] or "No such file or directory" in lines[0]
    else:
        assert says in lines[0]


def test_plan_needs_a_model_or_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan"])
    assert exit_.value.code == 2
    assert "one of --model, --model-config or --spec is required" in capsys.readouterr().err
