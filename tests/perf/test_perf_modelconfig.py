"""Any model's shape from its Hugging Face config.json: real configs of eleven models in seven families."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xpyd_perf import MODELS, ModelConfigError, model_from_config, parse_json, replica_fit, resolve_model
from xpyd_perf.hardware import GPUS
from xpyd_perf.modelconfig import MXFP4_BYTES, describe, language_config

CONFIGS = Path(__file__).parent / "data" / "model-configs"


def load(stem: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CONFIGS / f"{stem}.json").read_text(encoding="utf-8"))
    return doc


def derived(stem: str) -> Any:
    return model_from_config(load(stem), stem.replace("--", "/"))


# config file -> (published total parameters, published active parameters, KV bytes per token) from the model
# cards: Meta's 8.03B / 70.6B, Qwen's 32.8B / 72.7B, Mistral's 7.25B, Mixtral's 46.7B (12.9B active), DeepSeek's
# 671B (36.6B active with the 0.9B output head, README_WEIGHTS), Gemma's 9.24B / 27.4B, OpenAI's 116.8B (5.1B
# active), Phi-3-mini's 3.8B.
PUBLISHED: dict[str, tuple[float, float, int]] = {
    "meta-llama--Llama-3.1-8B-Instruct": (8.03e9, 8.03e9, 32 * 8 * 128 * 2 * 2),
    "meta-llama--Llama-3.1-70B-Instruct": (70.6e9, 70.6e9, 80 * 8 * 128 * 2 * 2),
    "Qwen--Qwen3-32B": (32.8e9, 32.8e9, 64 * 8 * 128 * 2 * 2),
    "Qwen--Qwen2.5-72B-Instruct": (72.7e9, 72.7e9, 80 * 8 * 128 * 2 * 2),
    "mistralai--Mistral-7B-Instruct-v0.3": (7.25e9, 7.25e9, 32 * 8 * 128 * 2 * 2),
    "mistralai--Mixtral-8x7B-Instruct-v0.1": (46.7e9, 12.9e9, 32 * 8 * 128 * 2 * 2),
    "deepseek-ai--DeepSeek-V3": (671e9, 36.6e9, 61 * (512 + 64) * 2),
    "google--gemma-2-9b-it": (9.24e9, 9.24e9, 42 * 8 * 256 * 2 * 2),
    "google--gemma-3-27b-it": (27.4e9, 27.4e9, 62 * 16 * 128 * 2 * 2),
    "openai--gpt-oss-120b": (116.8e9, 5.1e9, 36 * 8 * 64 * 2 * 2),
    "microsoft--Phi-3-mini-4k-instruct": (3.82e9, 3.82e9, 32 * 32 * 96 * 2 * 2),
}
# Catalog entries with a config file above: the derived shape must agree with the hand-entered one.
CATALOGUED = {
    "llama-3.1-8b": "meta-llama--Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama--Llama-3.1-70B-Instruct",
    "qwen3-32b": "Qwen--Qwen3-32B",
    "deepseek-v3": "deepseek-ai--DeepSeek-V3",
    "gpt-oss-120b": "openai--gpt-oss-120b",
}


def test_every_config_file_is_in_the_table() -> None:
    assert sorted(p.stem for p in CONFIGS.glob("*.json")) == sorted(PUBLISHED)
    families = {load(stem).get("model_type") for stem in PUBLISHED}
    assert len(families) >= 6


@pytest.mark.parametrize("stem", sorted(PUBLISHED))
def test_shape_matches_the_published_counts(stem: str) -> None:
    params, active, kv = PUBLISHED[stem]
    model = derived(stem)
    assert model.kv_bytes_per_token == kv
    assert model.params == pytest.approx(params, rel=0.02)
    assert model.active_params == pytest.approx(active, rel=0.03)
    assert model.active_params <= model.params
    assert model.hf_name == stem.replace("--", "/") and model.key == stem.split("--")[1].lower()


@pytest.mark.parametrize("key", sorted(CATALOGUED))
def test_catalog_models_agree_with_their_configs(key: str) -> None:
    catalog, model = MODELS[key], derived(CATALOGUED[key])
    assert model.kv_bytes_per_token == catalog.kv_bytes_per_token
    shape = ("layers", "hidden", "q_heads", "kv_heads", "attn_head_dim", "max_model_len", "experts",
             "experts_per_token", "mla", "moe_layers", "compute_dtype")  # fmt: skip
    assert {f: getattr(model, f) for f in shape} == {f: getattr(catalog, f) for f in shape}
    assert model.params == pytest.approx(catalog.params, rel=0.01)
    assert model.weight_bytes == pytest.approx(catalog.weight_bytes, rel=0.02)
    assert model.weight_bytes_per_param == pytest.approx(catalog.weight_bytes_per_param, abs=0.01)


def test_fits_check_from_a_config_equals_the_catalogs() -> None:
    b200 = GPUS["B200"]
    for key, stem in CATALOGUED.items():
        for gpus in (1, 8):
            ours, theirs = replica_fit(derived(stem), b200, gpus), replica_fit(MODELS[key], b200, gpus)
            assert ours.fits is theirs.fits, key
            assert ours.kv_bytes_per_gpu == theirs.kv_bytes_per_gpu, key


def test_mla_caches_one_latent_per_layer_not_k_and_v() -> None:
    cfg = load("deepseek-ai--DeepSeek-V3")
    model = model_from_config(cfg, "deepseek-ai/DeepSeek-V3")
    assert model.mla and model.kv_heads == 1
    assert model.kv_bytes_per_token == cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    assert model.moe_layers == 61 - cfg["first_k_dense_replace"]
    assert model.weight_dtype == "fp8"  # quantization_config: fp8, block-scaled
    no_q_lora = model_from_config({**cfg, "q_lora_rank": None}, "x")
    assert no_q_lora.params > model.params  # a full-rank query projection is larger


def test_mxfp4_quantizes_the_experts_only() -> None:
    model = derived("openai--gpt-oss-120b")
    experts = 36 * 128 * 3 * 2880 * 2880  # layers x experts x (gate, up, down)
    assert model.weight_bytes == pytest.approx(experts * MXFP4_BYTES + (model.params - experts) * 2, rel=0.01)
    assert 60e9 < model.weight_bytes < 70e9  # the checkpoint is about 65 GB


def test_nested_text_config_takes_the_wrappers_dtype_and_a_vision_tower() -> None:
    cfg = load("google--gemma-3-27b-it")
    assert "num_hidden_layers" not in cfg
    inner = language_config(cfg)
    assert inner["torch_dtype"] == "bfloat16" and inner["vocab_size"] == 262_208  # Gemma3TextConfig's default
    with_vision = model_from_config(cfg, "google/gemma-3-27b-it")
    text_only = model_from_config({**cfg, "vision_config": None}, "google/gemma-3-27b-it")
    assert 0.3e9 < with_vision.params - text_only.params < 0.6e9  # SigLIP's 400M
    assert with_vision.max_model_len == 131_072


@pytest.mark.parametrize(
    ("change", "kv", "bpp"),
    [
        ({}, 131_072, 2.0),
        ({"torch_dtype": "float16"}, 131_072, 2.0),
        ({"torch_dtype": "float32"}, 131_072, 2.0),  # served in 16 bits
        ({"torch_dtype": None, "dtype": "bfloat16"}, 131_072, 2.0),  # transformers >= 4.56 writes "dtype"
        ({"torch_dtype": "float8_e4m3fn"}, 65_536, 1.0),
        ({"num_key_value_heads": None}, 131_072 * 4, 2.0),  # no GQA: one KV head per query head
        ({"head_dim": 64}, 65_536, 2.0),
        ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, 131_072, 1.0),
        ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, 131_072, 0.5625),
        ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}, 131_072, 0.5156),
        (
            {"quantization_config": {"quant_method": "compressed-tensors",
                                     "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}},
            131_072, 1.0,
        ),
        ({"layer_types": ["full_attention"] * 16 + ["linear_attention"] * 16}, 65_536, 2.0),
    ],
)  # fmt: skip
def test_dtype_heads_and_quantization(change: dict[str, Any], kv: int, bpp: float) -> None:
    cfg = {k: v for k, v in {**load("meta-llama--Llama-3.1-8B-Instruct"), **change}.items() if v is not None}
    model = model_from_config(cfg, "acme/llama-like")
    assert model.kv_bytes_per_token == kv
    assert model.weight_bytes_per_param == pytest.approx(bpp, abs=1e-3)
    assert model.compute_dtype == ("bf16" if bpp >= 2 else "fp8")


def test_moe_variants() -> None:
    base = load("mistralai--Mixtral-8x7B-Instruct-v0.1")
    qwen_moe = {**base, "num_local_experts": None, "num_experts": 8, "moe_intermediate_size": 1024,
                "shared_expert_intermediate_size": 4096, "decoder_sparse_step": 2}  # fmt: skip
    model = model_from_config({k: v for k, v in qwen_moe.items() if v is not None}, "acme/qwen-moe")
    assert model.moe_layers == 16 and model.experts == 8 and model.experts_per_token == 2
    unchosen = 16 * (8 - 2) * 3 * 4096 * 1024  # experts a token does not use, in the 16 MoE layers
    embedding = 32000 * 4096  # a lookup, not counted as active
    assert model.params - model.active_params == pytest.approx(unchosen + embedding, rel=1e-6)
    dense_layers, shared = 16 * 3 * 4096 * 14336, 16 * 3 * 4096 * 4096
    assert model.active_params > dense_layers + shared


@pytest.mark.parametrize(
    ("drop", "change", "message"),
    [
        ("num_hidden_layers", {}, "missing key num_hidden_layers"),
        ("hidden_size", {}, "missing key hidden_size"),
        ("num_attention_heads", {}, "missing key num_attention_heads"),
        ("vocab_size", {}, "missing key vocab_size"),
        ("intermediate_size", {}, "missing key intermediate_size"),
        ("max_position_embeddings", {}, "missing key max_position_embeddings"),
        (None, {"num_hidden_layers": "32"}, "num_hidden_layers: expected a whole number"),
        (None, {"num_key_value_heads": 0}, "num_key_value_heads: expected a whole number >= 1"),
        (None, {"hidden_size": 4100}, "missing key head_dim"),
        (None, {"torch_dtype": "int3"}, "torch_dtype: 'int3'"),
        (None, {"quantization_config": {"quant_method": "hqq"}}, "quantization_config.quant_method: 'hqq'"),
        (None, {"num_local_experts": 8}, "missing key num_experts_per_tok"),
        (None, {"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok: 9 is more than"),
        (None, {"kv_lora_rank": 512}, "missing key qk_rope_head_dim"),
    ],
)
def test_errors_name_the_key(drop: str | None, change: dict[str, Any], message: str) -> None:
    cfg = {**load("meta-llama--Llama-3.1-8B-Instruct"), **change}
    if drop:
        del cfg[drop]
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(")):
        model_from_config(cfg, "acme/broken")


def test_parse_json_says_where_it_is_broken() -> None:
    assert parse_json('{"a": 1}') == {"a": 1}
    with pytest.raises(ModelConfigError, match=r"cm key config.json: not JSON: .* line 1 column 2"):
        parse_json("{oops", "cm key config.json")
    with pytest.raises(ModelConfigError, match="a JSON object, got list"):
        parse_json("[1]")
    with pytest.raises(ModelConfigError, match="a JSON object"):
        model_from_config([], "x")  # type: ignore[arg-type]


def test_describe_names_layers_kv_and_weights() -> None:
    assert describe(resolve_model("llama-3.1-8b")) == (
        "32 layers, 8 KV heads x 128: 131072 KV bytes/token; 8.0B params, 17 GB of bf16 weights"
    )
    assert "MLA latent 1152 B/layer" in describe(derived("deepseek-ai--DeepSeek-V3"))
