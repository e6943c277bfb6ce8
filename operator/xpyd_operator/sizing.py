"""Sizes an engine pod takes from its model and GPUs: the fits-check, /dev/shm, the startup budget, the cache.

Everything here is derived from the model's shape (its config.json through spec.model.config or
spec.model.configMap, else the performance model's catalog, xpyd_perf) and the engine's own
flags in spec.engine.args and spec.<pool>.args (--max-model-len, --gpu-memory-utilization,
--quantization, --kv-cache-dtype), so a pool that asks for tensor parallel 8 gets a /dev/shm,
a startup probe and a model cache sized for it without a pod patch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_perf import (
    BreakEven,
    Fit,
    ModelConfigError,
    ModelSpec,
    UnknownModelError,
    break_even,
    model_from_config,
    quantized,
    replica_fit,
    resolve_model,
)
from xpyd_perf.fits import GPU_MEMORY_UTILIZATION

GI: Final = 2**30
SHM_PER_GPU_GI: Final = 2  # NCCL and the engines' shared-memory queues: Dynamo's 8Gi default, llm-d's 16Gi at TP4
SHM_MIN_GI: Final = 8
STARTUP_PERIOD_S: Final = 10
STARTUP_BASE_S: Final = 600  # CUDA graph capture, torch.compile, DeepGEMM warm-up after the weights are in
DOWNLOAD_BYTES_PER_S: Final = 100e6  # a first start downloads the weights: ~1 Gb/s from the Hugging Face Hub
STARTUP_UNKNOWN_S: Final = 1800  # a model of unknown size (outside the catalog, no config.json): 30 minutes
STARTUP_EXPERT_PARALLEL_S: Final = 1800  # DeepGEMM and DeepEP kernels compiled at first start (Dynamo's GB200: 100 min)
CACHE_HEADROOM: Final = 1.2  # tokenizer, config and the download's temporary files beside the weights
CACHE_EXTRA_GI: Final = 10

# Engine flags read from the command line, vLLM's name first, then SGLang's.
MAX_MODEL_LEN: Final = ("--max-model-len", "--context-length")
MEMORY_UTILIZATION: Final = ("--gpu-memory-utilization", "--mem-fraction-static")
QUANTIZATION: Final = ("--quantization",)
KV_CACHE_DTYPE: Final = ("--kv-cache-dtype",)
MAX_NUM_SEQS: Final = ("--max-num-seqs", "--max-running-requests")  # vLLM's, SGLang's batch cap


def flag(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value given to any of `names` (`--flag value` or `--flag=value`), as the engine reads it."""
    found: str | None = None
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name in names:
            if eq:
                found = value
            elif i + 1 < len(argv):
                found = argv[i + 1]
    return found


@dataclass(frozen=True)
class EngineFlags:
    max_model_len: int | None
    memory_utilization: float
    quantization: str | None
    fp8_kv_cache: bool
    max_num_seqs: int | None = None  # sequences one replica runs at once (the engine's default when None)


def engine_flags(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> EngineFlags:
    argv = [*spec.engine.args, *pool.args]

    def number(names: Sequence[str]) -> float | None:
        text = flag(argv, names)
        try:
            return float(text) if text is not None else None
        except ValueError:
            return None  # the engine will say so; the fits-check falls back to its defaults

    length = number(MAX_MODEL_LEN)
    seqs = number(MAX_NUM_SEQS)
    utilization = number(MEMORY_UTILIZATION)
    kv_dtype = (flag(argv, KV_CACHE_DTYPE) or "").lower()
    return EngineFlags(
        max_model_len=int(length) if length and length >= 1 else None,
        memory_utilization=utilization if utilization and 0 < utilization <= 1 else GPU_MEMORY_UTILIZATION,
        quantization=flag(argv, QUANTIZATION),
        fp8_kv_cache=kv_dtype.startswith("fp8"),
        max_num_seqs=int(seqs) if seqs and seqs >= 1 else None,
    )


def config_source(spec: DisaggregatedDeploymentSpec) -> str:
    """Where the model's config.json came from, as messages name it."""
    ref = spec.model.config_map
    return f"ConfigMap {ref.name} (key {ref.key})" if ref is not None else "spec.model.config"


def declared_model(spec: DisaggregatedDeploymentSpec) -> ModelSpec | None:
    """The model's shape: from its config.json when the spec carries one (spec.model.config, or the
    ConfigMap's the reconciler read into it), else the catalog's by name; None when neither knows it.

    Raises ModelConfigError for a config.json the shape cannot be read from (desired.check_model says so).
    """
    if spec.model.config is not None:
        return model_from_config(spec.model.config, spec.model.name)
    try:
        return resolve_model(spec.model.name)
    except UnknownModelError:
        return None


def unknown_shape(spec: DisaggregatedDeploymentSpec) -> bool:
    """Nothing in the spec or the catalog gives the model's shape: no config, no configMap, no kvBytesPerToken,
    a name outside the catalog (the model hub, when on, is asked for its config.json)."""
    model = spec.model
    if model.config is not None or model.config_map is not None or model.kv_bytes_per_token is not None:
        return False
    try:
        resolve_model(model.name)
    except UnknownModelError:
        return True
    return False


REVISION: Final = ("--revision",)  # the checkpoint's branch, tag or commit (vLLM's and SGLang's flag)


def model_revision(spec: DisaggregatedDeploymentSpec) -> str:
    """The revision the engines load (--revision in spec.engine.args, else a pool's args), else main."""
    for argv in (spec.engine.args, *(pool.args for pool in spec.pools().values())):
        if found := flag(argv, REVISION):
            return found
    return "main"


def catalog_model(spec: DisaggregatedDeploymentSpec, pool: PoolSpec | None = None) -> ModelSpec | None:
    """The model as its config.json or the catalog knows it (quantized as the name or --quantization says), or None
    (also for a config.json that cannot be read: the reconciler refuses such a spec before sizing anything)."""
    try:
        model = declared_model(spec)
    except ModelConfigError:
        return None
    if model is None:
        return None
    quantization = engine_flags(spec, pool).quantization if pool is not None else None
    if quantization:
        with contextlib.suppress(ValueError):  # a method the catalog does not model (awq, gptq): keep the name's
            model = quantized(model, quantization)
    return model


def replica_fit_of(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> Fit | None:
    """The fits-check of one replica of `pool`; None when it cannot be modelled (topology Any, no GPUs,
    a model outside the catalog without a config.json)."""
    topology = spec.topology.hardware
    model = catalog_model(spec, pool)
    if topology is None or model is None or pool.gpus_per_replica < 1:
        return None
    flags = engine_flags(spec, pool)
    per_token = spec.model.kv_bytes_per_token or model.kv_bytes_per_token
    if flags.fp8_kv_cache:
        per_token = max(1, per_token // 2)
    return replica_fit(
        model, topology.gpu, pool.tp * pool.pipeline_parallel_size, pool.data_parallel_size, pool.expert_parallel,
        flags.max_model_len, per_token, flags.memory_utilization,
    )  # fmt: skip


def shm_size(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> str:
    """/dev/shm: spec.engine.sharedMemorySize, else 2Gi per GPU of the pod and at least 8Gi."""
    gpus = pool.layout(spec.topology.hardware).gpus_per_pod
    return spec.engine.shared_memory_size or f"{max(SHM_MIN_GI, SHM_PER_GPU_GI * gpus)}Gi"


def startup_seconds(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> int:
    """How long a first start may take: download the weights (the checkpoint's size, whatever
    --quantization does in memory), load them, compile kernels and capture CUDA graphs."""
    model = catalog_model(spec)
    if model is None:
        return STARTUP_UNKNOWN_S
    warmup = STARTUP_BASE_S + (STARTUP_EXPERT_PARALLEL_S if pool.expert_parallel else 0)
    return warmup + math.ceil(model.weight_bytes / DOWNLOAD_BYTES_PER_S)


def startup_failure_threshold(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> int:
    """The startup probe's failureThreshold at one probe every STARTUP_PERIOD_S seconds."""
    return math.ceil(startup_seconds(spec, pool) / STARTUP_PERIOD_S)


def cache_size(spec: DisaggregatedDeploymentSpec) -> str | None:
    """The default (emptyDir) model cache's size limit: the weights with headroom; None for a model of unknown size."""
    model = catalog_model(spec)
    if model is None:
        return None
    return f"{math.ceil(model.weight_bytes * CACHE_HEADROOM / GI) + CACHE_EXTRA_GI}Gi"


def kv_bytes_per_token(spec: DisaggregatedDeploymentSpec) -> int | None:
    """The KV-cache bytes one prompt token takes on the decode pool, which is what a handoff moves
    (spec.model.kvBytesPerToken, else the model's shape; halved for an fp8 KV cache): the router's
    --kv-bytes-per-token. None without a prefill pool (no handoffs) or for a model of unknown shape."""
    if spec.prefill is None or spec.decode is None:
        return None
    model = catalog_model(spec, spec.decode)
    per_token = spec.model.kv_bytes_per_token or (model.kv_bytes_per_token if model is not None else 0)
    if per_token <= 0:
        return None
    return max(1, per_token // 2) if engine_flags(spec, spec.decode).fp8_kv_cache else per_token


def break_even_of(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> BreakEven | None:
    """The disaggregation verdict for a workload.promptTokens prompt on `pool`'s tensor parallel (t_transfer
    against t_stall); None for topology Any. ValueError for a model or replica the timing cannot place."""
    topology = spec.topology.hardware
    if topology is None:
        return None
    model = catalog_model(spec) or spec.model.name  # its config.json's shape, else the catalog's
    return break_even(model, topology.name, spec.workload.prompt_tokens, max(1, pool.tp), spec.model.kv_bytes_per_token)
