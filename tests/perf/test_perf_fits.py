"""The replica fits-check (weights + one longest sequence per GPU) and the quantized catalog entries it reads."""

from __future__ import annotations

import json

import pytest

from xpyd_perf import GPUS, MODELS, quantized, replica_fit, resolve_model
from xpyd_perf.cli import main as plan

GB = 1e9


@pytest.mark.parametrize(
    ("name", "key", "weight_gb"),
    [
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3", 671),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseek-r1", 671),
        ("nvidia/DeepSeek-R1-FP4", "deepseek-r1-fp4", 377),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b", 141),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "llama-3.3-70b-fp8", 71),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", 141),
    ],
)
def test_quantized_checkpoints_resolve_by_name(name: str, key: str, weight_gb: float) -> None:
    model = resolve_model(name)
    assert model.key == key
    assert model.weight_bytes / GB == pytest.approx(weight_gb, abs=1)


def test_quantized_keeps_the_shape_and_refuses_unknown_types() -> None:
    base = MODELS["llama-3.1-70b"]
    fp8 = quantized(base, "FP8")
    assert (fp8.kv_bytes_per_token, fp8.layers, fp8.compute_dtype) == (base.kv_bytes_per_token, base.layers, "fp8")
    assert quantized(base, "bf16") is base
    with pytest.raises(ValueError, match="valid: bf16, fp8, fp4"):
        quantized(base, "int3")


# (model, gpu, tp, dp, expert parallel, max_model_len, fits, GB per GPU): an HGX node's 8 x B200 = 1.44 TB
# and a GB200 tray's 4 x 186 GB, at vLLM's 0.9 memory utilization.
CASES = [
    ("deepseek-v3", "GB200", 4, 1, False, None, False, 167.8 + 11.5),  # 671 GB does not fit one tray
    ("deepseek-v3", "B200", 8, 1, False, None, True, 83.9 + 11.5),
    ("deepseek-r1", "B200", 1, 8, True, None, True, 98.4 + 11.5),  # wide EP: dense layers on every rank
    ("deepseek-r1-fp4", "GB200", 1, 4, True, 32768, True, 101.3 + 2.3),
    ("llama-3.1-70b", "B200", 1, 1, False, None, False, 141.2 + 42.9),  # the default 128k context
    ("llama-3.1-70b", "B200", 1, 1, False, 16384, True, 141.2 + 5.4),
    ("llama-3.1-70b", "B200", 4, 1, False, None, True, 35.3 + 10.7),
    ("llama-3.1-70b", "B200", 1, 4, False, 16384, True, 141.2 + 5.4),  # data parallel copies the weights
]


@pytest.mark.parametrize(("model", "gpu", "tp", "dp", "ep", "length", "fits", "need_gb"), CASES)
def test_replica_fit(
    model: str, gpu: str, tp: int, dp: int, ep: bool, length: int | None, fits: bool, need_gb: float
) -> None:
    fit = replica_fit(resolve_model(model), GPUS[gpu], tp, dp, ep, length)
    assert fit.fits is fits
    assert fit.need_bytes_per_gpu / GB == pytest.approx(need_gb, abs=0.2)
    assert fit.gpus == tp * dp
    assert ("does not fit" in fit.summary()) is not fits


def test_summary_names_the_numbers() -> None:
    text = replica_fit(MODELS["deepseek-v3"], GPUS["GB200"], 4).summary()
    for number in ("671 GB of fp8 weights", "4 x GB200 (TP4)", "167.8 GB of weights", "11.5 GB of KV cache",
                   "163840-token sequence", "179.3 GB per GPU", "> 167.4 GB usable", "0.9 x 186 GB HBM"):  # fmt: skip
        assert number in text, text


def test_fp8_kv_and_lower_utilization_move_the_verdict() -> None:
    model, b200 = MODELS["llama-3.1-70b"], GPUS["B200"]
    assert not replica_fit(model, b200, 1, memory_utilization=0.9).fits
    assert replica_fit(model, b200, 1, kv_bytes_per_token=model.kv_bytes_per_token // 8).fits
    with pytest.raises(ValueError, match="must be >= 1"):
        replica_fit(model, b200, 0)


def test_plan_refuses_what_the_operator_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan(["--model", "deepseek-v3", "--topology", "GB200-NVL72", "--gpus-per-replica", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xpyd plan: error: ") and err.count("\n") == 1
    assert replica_fit(MODELS["deepseek-v3"], GPUS["GB200"], 4).summary() in err


def test_plan_reports_the_fit(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--model",
        "llama-3.1-70b",
        "--gpus-per-replica",
        "1",
        "--max-model-len",
        "16384",
        "--prompt-tokens",
        "4096",
    ]
    assert plan([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fit"]["fits"] is True and doc["fit"]["max_model_len"] == 16384
    assert plan(["--model", "llama-3.1-70b", "--quantization", "fp8", "--gpus-per-replica", "1", "--prompt-tokens",
                 "4096"]) == 0  # fmt: skip
    assert "replica: llama-3.1-70b-fp8 (71 GB of fp8 weights)" in capsys.readouterr().out
