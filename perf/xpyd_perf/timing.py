"""Roofline timings: prefill, one engine step, one decode step, KV handoff, and a prefill's stall.

All functions are pure and take seconds of modelled GPU time (no speed-up applied):

- ``step_seconds``: one continuous-batching step, max(compute, HBM) + a fixed step overhead.
  Compute = (2 x active params x tokens + attention FLOPs) / (tp x peak x MFU);
  HBM = (weights read + KV read) / (tp x bandwidth x efficiency).
- ``prefill_seconds(model, gpu, tokens, cached_tokens, tp)``: one unchunked prefill of the
  uncached tail of a prompt (its attention still covers the cached head).
- ``decode_step_seconds(model, gpu, batch, context_tokens, tp)``: one decode step for ``batch``
  sequences with ``context_tokens`` tokens of context each.
- ``handoff_seconds(kv_bytes, path, gpu, lanes)``: moving a KV cache over NVLink or RDMA NICs,
  ``lanes`` links in parallel (the cache split by heads over TP ranks, one NIC each).
- ``stall_seconds``: the decode time co-located streams lose while a prompt is prefilled
  next to them in chunks (zero while the chunk fits under the step's memory-bound slack).
- ``group_step_seconds(model, gpu, par, ...)``: one step of a replica laid out as `par` (data
  and expert parallel, possibly over many nodes; ``group_step_parts`` splits it into compute,
  HBM and all-to-all); ``a2a_seconds``: its MoE all-to-all.
"""

from __future__ import annotations

from typing import Final

from xpyd_perf.hardware import NVLINK, RDMA, GpuSpec, KvPath
from xpyd_perf.models import ModelSpec
from xpyd_perf.topology import Parallelism

MFU: Final = 0.40  # share of dense peak FLOP/s a large prefill reaches
HBM_EFFICIENCY: Final = 0.80  # share of HBM bandwidth a decode step reaches
NVLINK_EFFICIENCY: Final = 0.88  # 395 GB/s measured of 450 GB/s on H100 (seed)
NIC_EFFICIENCY: Final = 1.0  # the seed's 400 Gb/s = 50 GB/s per direction
STEP_OVERHEAD_S: Final = 0.0008  # scheduler + kernel launches per engine step (CUDA graphs)
HANDOFF_LATENCY_S: Final[dict[str, float]] = {NVLINK: 0.0002, RDMA: 0.001}  # setup, notification
DEFAULT_CHUNK_TOKENS: Final = 8192  # vLLM's default max_num_batched_tokens
# MoE all-to-all: DeepEP sends FP8 activations (one scale per 128 values) and combines in BF16.
DISPATCH_BYTES_PER_VALUE: Final = 1.0 + 4.0 / 128
COMBINE_BYTES_PER_VALUE: Final = 2.0
A2A_NIC_EFFICIENCY: Final = 0.90  # DeepEP reaches ~43-47 GB/s of a 50 GB/s 400G NIC
A2A_LATENCY_S: Final[dict[str, float]] = {NVLINK: 5e-6, RDMA: 20e-6}  # per dispatch or combine


def kv_bytes(model: ModelSpec, tokens: int, kv_bytes_per_token: int | None = None) -> int:
    """Bytes of KV cache for `tokens` tokens (an override replaces the catalog figure)."""
    return tokens * (kv_bytes_per_token if kv_bytes_per_token is not None else model.kv_bytes_per_token)


def attention_flops(model: ModelSpec, start: int, end: int) -> float:
    """Causal attention FLOPs (QK^T and AV) for positions start..end-1 attending to their past."""
    if end <= start:
        return 0.0
    pairs = (end * (end + 1) - start * (start + 1)) / 2
    return 4.0 * model.layers * model.q_heads * model.attn_head_dim * pairs


def step_seconds(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tp: int,
    tokens: int,
    attn_flops: float,
    kv_tokens_read: int,
) -> float:
    """One engine step that runs `tokens` tokens (prefill chunks + one per decode) through the model.

    `attn_flops` is their attention work and `kv_tokens_read` the cached tokens whose KV the
    step reads. Returns 0 for an empty step.
    """
    if tokens <= 0:
        return 0.0
    tp = max(1, tp)
    compute = (2.0 * model.active_params * tokens + attn_flops) / (tp * gpu.peak_flops(model.compute_dtype) * MFU)
    memory = (model.weight_bytes_read(tokens) + kv_tokens_read * model.kv_bytes_per_token) / (
        tp * gpu.hbm_bandwidth * HBM_EFFICIENCY
    )
    return max(compute, memory) + STEP_OVERHEAD_S


def prefill_seconds(model: ModelSpec, gpu: GpuSpec, tokens: int, cached_tokens: int = 0, tp: int = 1) -> float:
    """Time to prefill a `tokens`-token prompt whose first `cached_tokens` hit the prefix cache."""
    cached = min(max(0, cached_tokens), tokens)
    new = tokens - cached
    if new <= 0:
        return 0.0
    return step_seconds(
        model,
        gpu,
        tp=tp,
        tokens=new,
        attn_flops=attention_flops(model, cached, tokens),
        kv_tokens_read=tokens,
    )


def decode_step_seconds(model: ModelSpec, gpu: GpuSpec, batch: int, context_tokens: int, tp: int = 1) -> float:
    """Time of one decode step: `batch` sequences, each `context_tokens` tokens long."""
    if batch <= 0:
        return 0.0
    attn = 4.0 * model.layers * model.q_heads * model.attn_head_dim * context_tokens * batch
    return step_seconds(model, gpu, tp=tp, tokens=batch, attn_flops=attn, kv_tokens_read=batch * context_tokens)


def link_bandwidth(gpu: GpuSpec, path: KvPath) -> float:
    """Achieved bytes/s of one lane of a KV path (one GPU's NVLink or one NIC)."""
    if path == NVLINK:
        return gpu.nvlink_bandwidth * NVLINK_EFFICIENCY
    return gpu.nic_bandwidth * NIC_EFFICIENCY


def handoff_lanes(model: ModelSpec, prefill_tp: int, decode_tp: int, dp_attention: bool = False) -> int:
    """How many links carry one request's KV cache in parallel.

    Split by heads, each TP rank ships its own slice on its own rail: min(tp_p, tp_d, kv heads)
    lanes. Data-parallel attention keeps a request's cache on one GPU (one lane), and so does
    MLA, whose latent cache is replicated rather than split across ranks.
    """
    if dp_attention or model.mla:
        return 1
    return max(1, min(prefill_tp, decode_tp, model.kv_heads))


def handoff_seconds(kv_bytes: int, path: KvPath, gpu: GpuSpec, lanes: int = 1) -> float:
    """Time to move `kv_bytes` of KV cache from a prefill to a decode worker over `path`."""
    if kv_bytes <= 0:
        return 0.0
    return HANDOFF_LATENCY_S[path] + kv_bytes / (max(1, lanes) * link_bandwidth(gpu, path))


def path_between(domain_a: str | None, domain_b: str | None) -> KvPath:
    """NVLink when both workers share an NVLink domain (node on HGX, clique on NVL72), else RDMA."""
    return NVLINK if domain_a and domain_a == domain_b else RDMA


def stall_seconds(
    model: ModelSpec,
    gpu: GpuSpec,
    prompt_tokens: int,
    tp: int = 1,
    decode_batch: int = 32,
    decode_context: int = 2048,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> float:
    """Decode time lost by `decode_batch` co-located streams while this prompt is prefilled.

    The prompt is prefilled in chunks of `chunk_tokens` riding along decode steps; each chunk
    costs the streams the difference between the mixed step and a decode-only step. A short
    prompt fits in the memory-bound slack of one step and stalls (almost) nothing.
    """
    base_attn = 4.0 * model.layers * model.q_heads * model.attn_head_dim * decode_context * decode_batch
    base_kv = decode_batch * decode_context
    base = step_seconds(model, gpu, tp=tp, tokens=decode_batch, attn_flops=base_attn, kv_tokens_read=base_kv)
    stall = 0.0
    done = 0
    chunk = max(1, chunk_tokens)
    while done < prompt_tokens:
        end = min(prompt_tokens, done + chunk)
        mixed = step_seconds(
            model,
            gpu,
            tp=tp,
            tokens=decode_batch + end - done,
            attn_flops=base_attn + attention_flops(model, done, end),
            kv_tokens_read=base_kv + end,
        )
        stall += mixed - base if decode_batch > 0 else mixed
        done = end
    return stall


def a2a_bytes(model: ModelSpec, par: Parallelism, tokens: int, busiest: float | None = None) -> tuple[float, float]:
    """(NVLink bytes, NIC bytes) one GPU sends in one MoE layer's dispatch + combine for a step of `tokens`.

    Each GPU dispatches its rank's tokens (`busiest` on the busiest data-parallel rank, by default
    an even tokens / dp) split over its tp GPUs, to k experts picked uniformly over the `world`
    expert-parallel ranks. Copies to GPUs of its own NVLink domain ride NVLink. Low-latency kernels
    send every copy for another domain over the NIC; the throughput kernels send a token once per
    remote domain it needs and forward it over NVLink there.
    """
    if not (par.expert_parallel and model.is_moe) or tokens <= 0 or par.world <= 1:
        return 0.0, 0.0
    world, near = par.world, par.nvlink_gpus
    per_gpu = (tokens / max(1, par.dp) if busiest is None else busiest) / max(1, par.tp)
    copies = per_gpu * model.experts_per_token
    per_copy = model.hidden * (DISPATCH_BYTES_PER_VALUE + COMBINE_BYTES_PER_VALUE)
    if par.a2a == "low_latency":
        return copies * (near - 1) / world * per_copy, copies * (world - near) / world * per_copy
    domains = world / near
    remote = per_gpu * (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** model.experts_per_token)
    return copies * (near - 1) / near * per_copy, remote * per_copy


def a2a_seconds(model: ModelSpec, gpu: GpuSpec, par: Parallelism, tokens: int, busiest: float | None = None) -> float:
    """The all-to-all time of one step over every MoE layer a GPU runs (0 without expert parallel)."""
    nvlink, nic = a2a_bytes(model, par, tokens, busiest)
    if nvlink <= 0 and nic <= 0:
        return 0.0
    path = RDMA if par.spans_domains else NVLINK
    per_layer = max(nvlink / link_bandwidth(gpu, NVLINK), nic / (gpu.nic_bandwidth * A2A_NIC_EFFICIENCY))
    per_layer += 2 * A2A_LATENCY_S[path]
    return per_layer * model.moe_layer_count / max(1, par.pp)


def group_step_parts(
    model: ModelSpec,
    gpu: GpuSpec,
    par: Parallelism,
    *,
    tokens: int,
    attn_flops: float,
    kv_tokens_read: int,
    busiest: int | None = None,
) -> tuple[float, float, float]:
    """(compute, HBM, all-to-all) seconds of the busiest GPU in a replica step (see ``group_step_seconds``)."""
    if tokens <= 0:
        return 0.0, 0.0, 0.0
    dp, shard = max(1, par.dp), max(1, par.tp) * max(1, par.pp)
    rank = min(1.0, max(1.0 / dp, (busiest or 0) / tokens))  # the busiest rank's share of the step
    peak = gpu.peak_flops(model.compute_dtype) * MFU
    routed = model.expert_params * model.experts_per_token / model.experts if model.is_moe else 0.0
    compute = (2.0 * (model.active_params - routed) * tokens * rank + attn_flops * rank) / (shard * peak)
    compute += 2.0 * routed * tokens / (par.world * peak)  # the experts' work is spread over every GPU
    experts = model.expert_params * model.weight_bytes_per_param * model.experts_touched(tokens) / par.world
    kv_split = max(1, par.pp) * (1 if model.mla else max(1, min(par.tp, model.kv_heads)))
    memory = model.dense_bytes / shard + experts + kv_tokens_read * rank * model.kv_bytes_per_token / kv_split
    return compute, memory / (gpu.hbm_bandwidth * HBM_EFFICIENCY), a2a_seconds(model, gpu, par, tokens, tokens * rank)


def group_step_seconds(
    model: ModelSpec,
    gpu: GpuSpec,
    par: Parallelism,
    *,
    tokens: int,
    attn_flops: float,
    kv_tokens_read: int,
    busiest: int | None = None,
) -> float:
    """One step of a whole replica: `tokens` over all its data-parallel ranks.

    Ranks run in lockstep, so the step lasts as long as its busiest GPU: `busiest` tokens on one
    rank (default: an even tokens / dp; a lone long prompt sits on one rank). Per GPU: compute =
    2 x (dense active params x its rank's tokens + routed expert params x tokens / world) +
    attention, at peak x MFU; HBM = its tp x pp shard of the dense weights (replicated per rank)
    + its 1/world of the routed experts any token touches + its rank's KV read (a latent MLA cache
    is whole on every tensor-parallel rank, a per-head one split over min(tp, kv heads)). The
    all-to-all adds to max(compute, HBM), or hides behind it with two micro-batches (`overlap`).
    """
    if tokens <= 0:
        return 0.0
    compute, memory, comm = group_step_parts(
        model, gpu, par, tokens=tokens, attn_flops=attn_flops, kv_tokens_read=kv_tokens_read, busiest=busiest
    )
    core = max(compute, memory)
    return (max(core, comm) if par.overlap else core + comm) + STEP_OVERHEAD_S
