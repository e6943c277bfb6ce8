"""A model's shape from its Hugging Face `config.json`: any model, not only the catalog's.

`model_from_config(config, name)` turns the parsed JSON of a checkpoint's `config.json` into the
`ModelSpec` the fits-check and the timings use, so a model outside the catalog is sized from what it
says about itself:

- layers (`num_hidden_layers`), width (`hidden_size`), query heads (`num_attention_heads`), KV heads
  (`num_key_value_heads`, grouped-query attention; default: one per query head) and the head size
  (`head_dim`, else `hidden_size / num_attention_heads`);
- KV bytes per token: K and V of every layer and KV head, 2 x layers x kv_heads x head_dim x bytes; for
  multi-head latent attention (DeepSeek-V2/V3: `kv_lora_rank`, `qk_rope_head_dim`) one latent per layer,
  layers x (kv_lora_rank + qk_rope_head_dim) x bytes; layers that keep no KV cache (`layer_types` of
  linear attention or Mamba) do not count; sliding-window layers count in full (an upper bound: the
  engines' hybrid allocators keep less);
- the KV cache's bytes per value from `torch_dtype` (or `dtype`): 2 for bfloat16, float16 and float32
  (the engines serve a float32 checkpoint in 16 bits), 1 for the float8 types;
- parameters estimated from the shapes: embeddings (and the output head unless `tie_word_embeddings`),
  attention (MLA's low-rank projections included), the MLP (`intermediate_size`; gated: three matrices),
  MoE layers (`n_routed_experts` / `num_local_experts` / `num_experts` of `moe_intermediate_size`, shared
  experts, the router, dense layers before `first_k_dense_replace` or between `decoder_sparse_step`s),
  and a vision tower (`vision_config`) roughly; active parameters per token with `num_experts_per_tok`
  experts (the output head counted, the input embedding, a lookup, not);
- weight bytes per parameter from `quantization_config` (fp8, MXFP4 experts, NVFP4, compressed-tensors,
  AWQ/GPTQ bits), else the 16-bit dtype;
- a multimodal wrapper's language model under `text_config` (`language_config`, `llm_config`), with the
  wrapper's dtype and quantization where the inner config has none.

A config missing what the estimate needs raises ModelConfigError naming the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from xpyd_perf.models import WEIGHT_BYTES, ModelSpec

_NESTED: Final = ("text_config", "language_config", "llm_config")
_INHERITED: Final = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings")
# What a config class fills in when the file leaves it out (transformers' defaults for those types).
_TYPE_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "head_dim": 256},
    "gemma2": {"head_dim": 256, "tie_word_embeddings": True},
    "gemma": {"head_dim": 256, "tie_word_embeddings": True},
}
# Decoder types whose MLP is two matrices (up, down), not gated (gate, up, down).
_UNGATED: Final = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "falcon", "opt", "bloom", "phi", "starcoder2", "mpt"}
)
_KV_BYTES: Final[dict[str, int]] = {
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 2, "float": 2, "fp32": 2,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "fp8": 1,
}  # fmt: skip
MXFP4_BYTES: Final = 4.25 / 8  # 4-bit values and one 8-bit scale per 32 (OCP microscaling)


class ModelConfigError(ValueError):
    """A config.json the shape cannot be read from; the message names the key."""


def parse_json(text: str, source: str = "config.json") -> dict[str, Any]:
    """The JSON object in `text`, or ModelConfigError saying where it is broken."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{source}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(f"{source}: a config.json is a JSON object, got {type(doc).__name__}")
    return doc


def language_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's keys: the config itself, or its `text_config` with the wrapper's dtype and quantization."""
    for key in _NESTED:
        inner = config.get(key)
        if isinstance(inner, Mapping) and inner:
            merged = {k: config[k] for k in _INHERITED if k in config}
            return {**_TYPE_DEFAULTS.get(str(inner.get("model_type", "")), {}), **merged, **inner}
    return {**_TYPE_DEFAULTS.get(str(config.get("model_type", "")), {}), **config}


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None, minimum: int = 1) -> int:
    """The first of `keys` present (not null), as a whole number >= minimum; else default or an error."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < minimum:
            raise ModelConfigError(f"{key}: expected a whole number >= {minimum}, got {value!r}")
        return int(value)
    if default is not None:
        return default
    raise ModelConfigError(f"missing key {keys[0]}" + (f" (or {', '.join(keys[1:])})" if keys[1:] else ""))


def _dtype(cfg: Mapping[str, Any]) -> str:
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    if value is None:
        return "bfloat16"  # the engines' default for a config that names none
    name = str(value).lower().removeprefix("torch.")
    if name not in _KV_BYTES:
        raise ModelConfigError(f"torch_dtype: {value!r} is not one of {', '.join(sorted(_KV_BYTES))}")
    return name


def _weight_bytes(quant: Mapping[str, Any], dense: float) -> tuple[float | None, float]:
    """(bytes per routed-expert parameter or None for all alike, bytes per other parameter) of a quantization."""
    method = str(quant.get("quant_method", "")).lower()
    if method in {"fp8", "fbgemm_fp8", "ptpc_fp8"}:
        return None, WEIGHT_BYTES["fp8"]
    if method == "mxfp4":  # gpt-oss: the experts only; attention, router and embeddings stay 16-bit
        return MXFP4_BYTES, dense
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        if algo.startswith("FP8"):
            return None, WEIGHT_BYTES["fp8"]
        if "FP4" in algo:
            return None, WEIGHT_BYTES["fp4"]
        raise ModelConfigError(f"quantization_config.quant_algo: {algo or None!r} is not modelled (FP8, NVFP4)")
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        bits = [
            (g.get("weights") or {}).get("num_bits")
            for g in (groups.values() if isinstance(groups, Mapping) else [])
            if isinstance(g, Mapping)
        ]
        found = [b for b in bits if isinstance(b, int)]
        if not found:
            raise ModelConfigError("quantization_config.config_groups: no weights.num_bits")
        widest = max(found)
        if widest >= 16:
            return None, dense
        if widest == 8:
            return None, WEIGHT_BYTES["fp8"]
        return None, WEIGHT_BYTES["fp4"] if "fp4" in str(quant.get("format", "")) else widest / 8 + 2 / 128
    if method in {"awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"}:
        width = _int(quant, "bits", "w_bit", default=4)
        group = quant.get("group_size", quant.get("q_group_size", 128))
        scales = 2 / group if isinstance(group, int) and group > 0 else 0.0  # one 16-bit scale per group
        return None, width / 8 + scales
    if method == "bitsandbytes":
        return None, WEIGHT_BYTES["fp8"] if quant.get("load_in_8bit") else 0.5 + 2 / 64
    raise ModelConfigError(
        f"quantization_config.quant_method: {method or None!r} is not modelled "
        "(fp8, mxfp4, modelopt, compressed-tensors, awq, gptq, bitsandbytes)"
    )


def _kv_layers(cfg: Mapping[str, Any], layers: int) -> int:
    """Layers that keep a KV cache: all, unless `layer_types` says some are linear attention or Mamba."""
    types = cfg.get("layer_types")
    if not isinstance(types, list) or not types:
        return layers
    kept = [t for t in types[:layers] if "attention" in str(t) and "linear" not in str(t)]
    return len(kept) or layers


def _moe_layer(cfg: Mapping[str, Any], index: int) -> bool:
    """Whether decoder layer `index` routes to experts (DeepSeek's first_k_dense_replace and moe_layer_freq,
    Qwen-MoE's decoder_sparse_step and mlp_only_layers, Llama-4's interleave_moe_layer_step)."""
    if index < _int(cfg, "first_k_dense_replace", default=0, minimum=0):
        return False
    if index in (cfg.get("mlp_only_layers") or []):
        return False
    step = _int(cfg, "decoder_sparse_step", "interleave_moe_layer_step", default=1)
    freq = _int(cfg, "moe_layer_freq", default=1)
    return (index + 1) % step == 0 and index % freq == 0


def _key(name: str) -> str:
    return name.strip().rsplit("/", 1)[-1].lower() or "model"


def model_from_config(config: Mapping[str, Any], name: str, max_model_len: int | None = None) -> ModelSpec:
    """The ModelSpec of the model `config` (a parsed config.json) describes, served as `name`.

    Raises ModelConfigError naming the key it misses or cannot read.
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"a config.json is a JSON object, got {type(config).__name__}")
    cfg = language_config(config)
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head", "num_heads")
    vocab = _int(cfg, "vocab_size", "padded_vocab_size")
    dtype = _dtype(cfg)
    value_bytes = _KV_BYTES[dtype]
    quant = cfg.get("quantization_config")
    expert_bytes, dense_bytes = _weight_bytes(quant, 2.0) if isinstance(quant, Mapping) else (None, float(value_bytes))
    mla = cfg.get("kv_lora_rank") is not None
    kv_layers = _kv_layers(cfg, layers)
    if mla:
        rank = _int(cfg, "kv_lora_rank")
        rope = _int(cfg, "qk_rope_head_dim")
        nope = _int(cfg, "qk_nope_head_dim")
        v_dim = _int(cfg, "v_head_dim", default=nope)
        q_rank = _int(cfg, "q_lora_rank", default=0, minimum=0)
        q_proj = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        attention = q_proj + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
        kv_heads, head_dim, attn_head_dim = 1, rank + rope, (nope + rope + v_dim) // 2
        kv_per_token = kv_layers * (rank + rope) * value_bytes
    else:
        kv_heads = 1 if cfg.get("multi_query") is True else _int(cfg, "num_key_value_heads", "n_head_kv", default=heads)
        if "head_dim" in cfg and cfg["head_dim"] is not None:
            head_dim = _int(cfg, "head_dim")
        elif hidden % heads:
            raise ModelConfigError(f"missing key head_dim (hidden_size {hidden} is not a multiple of {heads} heads)")
        else:
            head_dim = hidden // heads
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        attn_head_dim = head_dim
        kv_per_token = 2 * kv_layers * kv_heads * head_dim * value_bytes
    model_type = str(cfg.get("model_type", "")).lower()
    mlp_mats = 2 if model_type in _UNGATED else 3
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0, minimum=0)
    moe = experts > 1
    dense_inner = _int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", default=0, minimum=0) or (
        4 * hidden if model_type in _UNGATED else 0
    )
    per_token = 0
    expert_mlp = shared_mlp = 0
    if moe:
        per_token = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", "top_k")
        if per_token > experts:
            raise ModelConfigError(f"num_experts_per_tok: {per_token} is more than the {experts} experts")
        inner = _int(cfg, "moe_intermediate_size", "intermediate_size")
        expert_mlp = mlp_mats * hidden * inner
        shared_inner = _int(cfg, "shared_expert_intermediate_size", default=0, minimum=0)
        shared_mlp = (
            mlp_mats * hidden * shared_inner
            if shared_inner
            else _int(cfg, "n_shared_experts", "num_shared_experts", default=0, minimum=0) * expert_mlp
        )
    moe_layers = sum(_moe_layer(cfg, i) for i in range(layers)) if moe else 0
    dense_layers = layers - moe_layers
    if dense_layers and not dense_inner:
        raise ModelConfigError("missing key intermediate_size")
    dense_mlp = mlp_mats * hidden * dense_inner
    router = hidden * experts
    tied = bool(cfg.get("tie_word_embeddings", True))
    embed = vocab * hidden
    head = 0 if tied else embed
    vision = _vision_params(config.get("vision_config"), hidden)
    expert_total = moe_layers * experts * expert_mlp
    other = layers * attention + dense_layers * dense_mlp + moe_layers * (shared_mlp + router) + embed + head + vision
    params = float(other + expert_total)
    # Per token: every weight of a dense model (as the catalog counts it); for MoE the published convention,
    # the chosen experts and the output head but not the input embedding (a lookup).
    active = params
    if moe:
        active = float(
            layers * attention + dense_layers * dense_mlp + moe_layers * (shared_mlp + router + per_token * expert_mlp)
            + (embed if tied else head)
        )  # fmt: skip
    weight_bytes = other * dense_bytes + expert_total * (dense_bytes if expert_bytes is None else expert_bytes)
    bytes_per_param = round(weight_bytes / params, 4)
    length = max_model_len or _int(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    return ModelSpec(
        key=_key(name),
        hf_name=name,
        params=params,
        active_params=min(active, params),
        layers=layers,
        hidden=hidden,
        q_heads=heads,
        kv_heads=kv_heads,
        attn_head_dim=attn_head_dim,
        kv_bytes_per_token=kv_per_token,
        weight_bytes_per_param=bytes_per_param,
        compute_dtype="bf16" if bytes_per_param >= WEIGHT_BYTES["bf16"] else "fp8",
        max_model_len=length,
        experts=experts if moe else 0,
        experts_per_token=per_token,
        mla=mla,
        moe_layers=moe_layers if moe and moe_layers != layers else 0,
    )


def _vision_params(vision: Any, text_hidden: int) -> int:
    """A vision encoder's parameters, roughly: per layer attention (4 h^2) and an MLP (2 h i), plus a projector."""
    if not isinstance(vision, Mapping):
        return 0
    try:
        h = _int(vision, "hidden_size", "embed_dim", "width")
        layers = _int(vision, "num_hidden_layers", "depth", "layers")
        inner = _int(vision, "intermediate_size", default=4 * h)
    except ModelConfigError:
        return 0  # an encoder described otherwise: its share is small beside the language model
    return layers * (4 * h * h + 2 * h * inner) + h * text_hidden


def describe(model: ModelSpec) -> str:
    """One line on what the shape is: the layers, the KV cache per token, the weights."""
    attention = (
        f"MLA latent {model.kv_bytes_per_token // max(1, model.layers)} B/layer"
        if model.mla
        else f"{model.kv_heads} KV heads x {model.attn_head_dim}"
    )
    moe = f", {model.experts} experts ({model.experts_per_token} per token)" if model.is_moe else ""
    return (
        f"{model.layers} layers, {attention}: {model.kv_bytes_per_token} KV bytes/token; "
        f"{model.params / 1e9:.1f}B params{moe}, "
        f"{math.ceil(model.weight_bytes / 1e9)} GB of {model.weight_dtype} weights"
    )
