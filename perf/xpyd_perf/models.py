"""Model catalog: the shapes (parameters, layers, heads, KV bytes per token) the timings need.

KV bytes per token are for the whole model in BF16 (K and V, every layer, every KV head):
layers x kv_heads x head_dim x 2 x 2 bytes, or layers x latent_dim x 2 bytes for MLA.
A quantized checkpoint is its base model with other weight bytes per parameter: a name that says
so (`RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic`, `nvidia/DeepSeek-R1-FP4`) or `quantized()`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final


class UnknownModelError(ValueError):
    """A model name that is not in the catalog; the message lists the valid names."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's shape. `attn_head_dim` is the per-head width used for attention FLOPs."""

    key: str
    hf_name: str
    params: float
    active_params: float
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    attn_head_dim: int
    kv_bytes_per_token: int
    weight_bytes_per_param: float
    compute_dtype: str  # "bf16" | "fp8": which tensor-core peak prefill runs at
    max_model_len: int
    experts: int = 0  # 0 for dense models
    experts_per_token: int = 0
    mla: bool = False  # multi-head latent attention: the KV cache is not split by heads
    moe_layers: int = 0  # layers with routed experts (0: every layer of an MoE model)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (what must fit in HBM)."""
        return self.params * self.weight_bytes_per_param

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def weight_dtype(self) -> str:
        """The weights' storage type: bf16, fp8, fp4, or bytes per parameter for a mixed checkpoint."""
        named = {bpp: dtype for dtype, bpp in WEIGHT_BYTES.items()}
        return named.get(self.weight_bytes_per_param, f"{self.weight_bytes_per_param:g} B/param")

    @property
    def expert_params(self) -> float:
        """Parameters of the routed experts (0 for dense models); the rest every token uses."""
        if not self.is_moe:
            return 0.0
        return (self.params - self.active_params) / (1.0 - self.experts_per_token / self.experts)

    @property
    def moe_layer_count(self) -> int:
        """Layers whose tokens go through routed experts (and so through an all-to-all under EP)."""
        if not self.is_moe:
            return 0
        return self.moe_layers or self.layers

    @property
    def dense_bytes(self) -> float:
        """Bytes of the weights every token uses: attention, shared experts, dense layers, embeddings."""
        return (self.params - self.expert_params) * self.weight_bytes_per_param

    def experts_touched(self, tokens: int) -> float:
        """Share of the routed experts at least one of `tokens` tokens picks: 1 - (1 - k/E)^tokens."""
        if not self.is_moe or tokens <= 0:
            return 0.0
        return 1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one forward pass over `tokens` tokens reads from HBM.

        Dense models read every weight once. MoE models read the shared part plus every expert
        that at least one token routes to: with k of E experts per token, an expert stays
        untouched with probability (1 - k/E)^tokens.
        """
        if not self.is_moe or tokens <= 0:
            return self.weight_bytes if tokens > 0 else 0.0
        return self.dense_bytes + self.expert_params * self.experts_touched(tokens) * self.weight_bytes_per_param


# Bytes per stored weight by type. FP4 is NVIDIA's NVFP4: 4-bit values plus one FP8 scale per 16.
WEIGHT_BYTES: Final[dict[str, float]] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
_DTYPE_ALIASES: Final[dict[str, str]] = {"fp16": "bf16", "nvfp4": "fp4", "w8a8": "fp8", "fp8-dynamic": "fp8"}


def quantized(model: ModelSpec, dtype: str) -> ModelSpec:
    """The model stored as `dtype` (bf16, fp8, fp4; fp16, nvfp4 and w8a8 as aliases): its key says so."""
    name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in WEIGHT_BYTES:
        raise ValueError(f"unknown weight type {dtype!r}; valid: {', '.join(WEIGHT_BYTES)}")
    if WEIGHT_BYTES[name] == model.weight_bytes_per_param:
        return model
    return replace(
        model,
        key=f"{model.key.removesuffix('-' + model.weight_dtype)}-{name}",
        weight_bytes_per_param=WEIGHT_BYTES[name],
        compute_dtype="bf16" if name == "bf16" else "fp8",
    )


_BASE: Final[dict[str, ModelSpec]] = {
    m.key: m
    for m in (
        ModelSpec(
            "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128,
            131_072, 2.0, "bf16", 131_072,
        ),
        ModelSpec(
            "llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 70.6e9, 80, 8192, 64, 8, 128,
            327_680, 2.0, "bf16", 131_072,
        ),
        ModelSpec(
            "qwen3-32b", "Qwen/Qwen3-32B", 32.8e9, 32.8e9, 64, 5120, 64, 8, 128,
            262_144, 2.0, "bf16", 40_960,
        ),
        ModelSpec(
            "deepseek-v3", "deepseek-ai/DeepSeek-V3", 671e9, 37e9, 61, 7168, 128, 1, 160,
            70_272, 1.0, "fp8", 163_840, experts=256, experts_per_token=8, mla=True, moe_layers=58,
        ),
        ModelSpec(
            "gpt-oss-120b", "openai/gpt-oss-120b", 116.8e9, 5.1e9, 36, 2880, 64, 8, 64,
            73_728, 0.56, "fp8", 131_072, experts=128, experts_per_token=4,
        ),
    )
}  # fmt: skip

# Releases with the shape of an entry above: the same layers, heads and KV bytes per token.
MODELS: Final[dict[str, ModelSpec]] = {
    **_BASE,
    "llama-3.3-70b": replace(_BASE["llama-3.1-70b"], key="llama-3.3-70b", hf_name="meta-llama/Llama-3.3-70B-Instruct"),
    "deepseek-r1": replace(_BASE["deepseek-v3"], key="deepseek-r1", hf_name="deepseek-ai/DeepSeek-R1-0528"),
}

_SUFFIXES: Final = re.compile(r"(-instruct|-chat|-base|-dynamic|-0324|-0528|-2507|-hf)+$")
_DTYPE: Final = re.compile(r"-(bf16|fp16|fp8|nvfp4|fp4|w8a8)(?=-|$)")


def _normalise(name: str) -> tuple[str, str | None]:
    """(catalog key, weight type the name states or None) for a key or a Hugging Face name."""
    base = name.strip().lower().rsplit("/", 1)[-1]
    base = base.removeprefix("meta-")
    dtypes = _DTYPE.findall(base)
    return _SUFFIXES.sub("", _DTYPE.sub("", base)), (dtypes[-1] if dtypes else None)


def resolve_model(name: str) -> ModelSpec:
    """The model for a catalog key ("llama-3.1-70b") or a Hugging Face name, case-insensitive.

    "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B" and "llama-3.1-70b" all
    resolve to the same entry; a name with a weight type ("-FP8", "-FP4") resolves to that
    quantization of it. An unknown name raises UnknownModelError listing the valid names.
    """
    key, dtype = _normalise(name)
    found = MODELS.get(key)
    if found is None:
        found = next((m for m in MODELS.values() if m.hf_name.lower() == name.strip().lower()), None)
    if found is None:
        valid = ", ".join(f"{m.key} ({m.hf_name})" for m in MODELS.values())
        raise UnknownModelError(f"unknown model {name!r}; valid models: {valid}")
    return quantized(found, dtype) if dtype else found
