"""The hardware performance model shared by the emulator, the operator and the simulator.

Pure functions and frozen catalogs, no I/O (`xpyd_perf.cli`, the `xpyd plan` command, is the one
module that reads files). Catalogs: GPUS (H100, H200, B200, GB200), TOPOLOGIES (HGX-B200,
GB200-NVL72, H100, HGX-H200), MODELS (llama-3.1-8b/70b, qwen3-32b, deepseek-v3, gpt-oss-120b),
looked up case-insensitively by resolve_gpu / resolve_topology / resolve_model (HF names too),
which raise UnknownGpuError / UnknownTopologyError / UnknownModelError (ValueErrors listing the
valid names). See `timing` for the roofline formulas and `breakeven` for the disaggregation
verdict (t_transfer < t_stall) and the xPyD suggestion.
"""

from xpyd_perf.breakeven import (
    BreakEven,
    XpydSuggestion,
    break_even,
    kv_capacity_tokens,
    suggest_xpyd,
)
from xpyd_perf.hardware import (
    GPUS,
    NVLINK,
    RDMA,
    TOPOLOGIES,
    GpuSpec,
    KvPath,
    Topology,
    UnknownGpuError,
    UnknownTopologyError,
    resolve_gpu,
    resolve_topology,
)
from xpyd_perf.models import MODELS, ModelSpec, UnknownModelError, resolve_model
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

__all__ = [
    "GPUS",
    "MODELS",
    "NVLINK",
    "RDMA",
    "TOPOLOGIES",
    "BreakEven",
    "GpuSpec",
    "KvPath",
    "ModelSpec",
    "Topology",
    "UnknownGpuError",
    "UnknownModelError",
    "UnknownTopologyError",
    "XpydSuggestion",
    "attention_flops",
    "break_even",
    "decode_step_seconds",
    "handoff_lanes",
    "handoff_seconds",
    "kv_bytes",
    "kv_capacity_tokens",
    "link_bandwidth",
    "path_between",
    "prefill_seconds",
    "resolve_gpu",
    "resolve_model",
    "resolve_topology",
    "stall_seconds",
    "step_seconds",
    "suggest_xpyd",
]
