"""The hardware performance model shared by the emulator, the operator and the simulator.

Pure functions and frozen catalogs, no I/O (`xpyd_perf.cli`, the `xpyd plan` command, is the one
module that reads files). Catalogs: GPUS (H100, H200, B200, GB200), TOPOLOGIES (HGX-B200,
GB200-NVL72, H100, HGX-H200: GPUs per node, NVLink domain, node labels; see `topology`),
MODELS (llama-3.1-8b/70b, llama-3.3-70b, qwen3-32b, deepseek-v3/r1, gpt-oss-120b; `quantized` for
FP8/FP4 checkpoints), looked up case-insensitively by resolve_gpu / resolve_topology / resolve_model
(HF names too), which raise UnknownGpuError / UnknownTopologyError / UnknownModelError (ValueErrors
listing the valid names). See `timing` for the roofline formulas, `breakeven` for the
disaggregation verdict (t_transfer < t_stall) and the xPyD suggestion, and `fits` for whether a
replica holds its weights and one longest sequence. Any other model is sized from its Hugging Face
config.json by `modelconfig.model_from_config` (ModelConfigError names what it misses).
"""

from xpyd_perf.breakeven import (
    BreakEven,
    XpydSuggestion,
    break_even,
    kv_capacity_tokens,
    suggest_xpyd,
)
from xpyd_perf.fits import Fit, replica_fit
from xpyd_perf.hardware import GPUS, NVLINK, RDMA, GpuSpec, KvPath, UnknownGpuError
from xpyd_perf.modelconfig import ModelConfigError, model_from_config, parse_json
from xpyd_perf.models import MODELS, WEIGHT_BYTES, ModelSpec, UnknownModelError, quantized, resolve_model
from xpyd_perf.timing import (
    attention_flops,
    decode_step_seconds,
    handoff_lanes,
    handoff_seconds,
    kv_bytes,
    link_bandwidth,
    path_between,
    prefill_seconds,
    stall_seconds,
    step_seconds,
)
from xpyd_perf.topology import (
    OFFERED,
    TOPOLOGIES,
    Topology,
    UnknownTopologyError,
    by_product,
    resolve_gpu,
    resolve_topology,
)

__all__ = [
    "GPUS",
    "MODELS",
    "NVLINK",
    "OFFERED",
    "RDMA",
    "TOPOLOGIES",
    "WEIGHT_BYTES",
    "BreakEven",
    "Fit",
    "GpuSpec",
    "KvPath",
    "ModelConfigError",
    "ModelSpec",
    "Topology",
    "UnknownGpuError",
    "UnknownModelError",
    "UnknownTopologyError",
    "XpydSuggestion",
    "attention_flops",
    "break_even",
    "by_product",
    "decode_step_seconds",
    "handoff_lanes",
    "handoff_seconds",
    "kv_bytes",
    "kv_capacity_tokens",
    "link_bandwidth",
    "model_from_config",
    "parse_json",
    "path_between",
    "prefill_seconds",
    "quantized",
    "replica_fit",
    "resolve_gpu",
    "resolve_model",
    "resolve_topology",
    "stall_seconds",
    "step_seconds",
    "suggest_xpyd",
]
