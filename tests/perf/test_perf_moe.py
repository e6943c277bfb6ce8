"""MoE with expert parallelism: active-parameter compute, experts spread over EP ranks, the all-to-all per layer."""

from __future__ import annotations

import pytest

from xpyd_perf import GPUS, MODELS, Topology, resolve_gpu, resolve_topology
from xpyd_perf.timing import (
    A2A_LATENCY_S,
    A2A_NIC_EFFICIENCY,
    COMBINE_BYTES_PER_VALUE,
    DISPATCH_BYTES_PER_VALUE,
    HBM_EFFICIENCY,
    MFU,
    STEP_OVERHEAD_S,
    a2a_bytes,
    a2a_seconds,
    attention_flops,
    group_step_parts,
    group_step_seconds,
    step_seconds,
)
from xpyd_perf.topology import Parallelism, replica_parallelism

DS = MODELS["deepseek-v3"]
LLAMA = MODELS["llama-3.1-70b"]
PER_COPY = DS.hidden * (DISPATCH_BYTES_PER_VALUE + COMBINE_BYTES_PER_VALUE)


def test_deepseek_shape() -> None:
    assert DS.moe_layer_count == 58 and MODELS["gpt-oss-120b"].moe_layer_count == 36 and LLAMA.moe_layer_count == 0
    assert DS.expert_params == pytest.approx(654.45e9, rel=1e-3)
    assert DS.dense_bytes == pytest.approx((671e9 - DS.expert_params) * 1.0)
    assert DS.experts_touched(1) == pytest.approx(8 / 256) and DS.experts_touched(100_000) == pytest.approx(1.0)
    assert DS.experts_touched(0) == 0.0 and LLAMA.experts_touched(10) == 0.0


@pytest.mark.parametrize(
    ("par", "world", "nvlink_gpus", "spans", "text"),
    [
        (Parallelism(dp=32, expert_parallel=True), 32, 8, True, "DP32 x TP1 over 32 GPUs, EP (high_throughput a2a, 4"),
        (Parallelism(dp=32, expert_parallel=True, domain_gpus=72), 32, 32, False, "1 NVLink domain)"),
        (Parallelism(tp=8, pp=2), 16, 8, True, "DP1 x TP8 x PP2 over 16 GPUs"),
        (Parallelism(tp=4, dp=2, domain_gpus=72), 8, 8, False, "DP2 x TP4 over 8 GPUs"),
    ],
)
def test_parallelism(par: Parallelism, world: int, nvlink_gpus: int, spans: bool, text: str) -> None:
    assert (par.world, par.nvlink_gpus, par.spans_domains) == (world, nvlink_gpus, spans)
    assert text in par.describe()


@pytest.mark.parametrize(("topology", "domain"), [("HGX-H800", 8), ("HGX-B200", 8), ("GB200-NVL72", 72), ("h800", 8)])
def test_replica_parallelism_takes_the_topology_domain(topology: str, domain: int) -> None:
    par = replica_parallelism(resolve_topology(topology), dp=16, expert_parallel=True, a2a="low_latency")
    assert (par.domain_gpus, par.a2a, par.overlap) == (domain, "low_latency", False)
    assert resolve_gpu("NVIDIA-H800").nvlink_bandwidth == 200e9  # NVLink cut to 400 GB/s both ways


@pytest.mark.parametrize(
    ("model", "par", "tokens", "nvlink", "nic"),
    [
        (LLAMA, Parallelism(dp=16, expert_parallel=True), 1024, 0.0, 0.0),  # dense: no all-to-all
        (DS, Parallelism(dp=16), 1024, 0.0, 0.0),  # experts split by TP: not modelled as an all-to-all
        (DS, Parallelism(expert_parallel=True), 1024, 0.0, 0.0),  # one GPU
        (DS, Parallelism(dp=8, expert_parallel=True, a2a="low_latency"), 1024, 128 * 8 * 7 / 8 * PER_COPY, 0.0),
        # 144 GPUs over 18 nodes, low latency: every copy for another node crosses a NIC
        (DS, Parallelism(dp=144, expert_parallel=True, a2a="low_latency"), 144 * 128,
         128 * 8 * 7 / 144 * PER_COPY, 128 * 8 * 136 / 144 * PER_COPY),
        # 32 GPUs over 4 nodes, throughput kernels: one copy per remote node a token needs, NVLink forwards
        (DS, Parallelism(dp=32, expert_parallel=True), 32 * 4096,
         4096 * 8 * 7 / 8 * PER_COPY, 4096 * 3 * (1 - 0.75**8) * PER_COPY),
    ],
)  # fmt: skip
def test_a2a_bytes(model: object, par: Parallelism, tokens: int, nvlink: float, nic: float) -> None:
    got = a2a_bytes(DS if model is DS else LLAMA, par, tokens)
    assert got == pytest.approx((nvlink, nic), rel=1e-9)


def test_throughput_kernels_send_fewer_nic_bytes_than_low_latency_ones() -> None:
    tokens = 32 * 4096
    ht = a2a_bytes(DS, Parallelism(dp=32, expert_parallel=True, a2a="high_throughput"), tokens)[1]
    ll = a2a_bytes(DS, Parallelism(dp=32, expert_parallel=True, a2a="low_latency"), tokens)[1]
    assert ht < 0.5 * ll


def test_a2a_seconds_over_nics_and_over_one_nvlink_domain() -> None:
    b200, gb200 = GPUS["B200"], GPUS["GB200"]
    hgx = Parallelism(dp=144, expert_parallel=True, a2a="low_latency", domain_gpus=8)
    tokens = 144 * 128
    nvlink, nic = a2a_bytes(DS, hgx, tokens)
    per_layer = max(nvlink / (900e9 * 0.88), nic / (50e9 * A2A_NIC_EFFICIENCY)) + 2 * A2A_LATENCY_S["RDMA"]
    assert a2a_seconds(DS, b200, hgx, tokens) == pytest.approx(58 * per_layer, rel=1e-9)
    rack = Parallelism(dp=72, expert_parallel=True, a2a="low_latency", domain_gpus=72)
    two_racks = Parallelism(dp=144, expert_parallel=True, a2a="low_latency", domain_gpus=72)
    in_rack = a2a_seconds(DS, gb200, rack, 72 * 128)
    assert in_rack < 0.2 * a2a_seconds(DS, b200, hgx, tokens)  # NVLink carries ~18x what a NIC does
    assert in_rack < a2a_seconds(DS, gb200, two_racks, tokens)  # half the copies leave the rack
    staged = Parallelism(tp=8, pp=2, dp=9, expert_parallel=True)  # a pipeline stage runs half the MoE layers
    nvlink, nic = a2a_bytes(DS, staged, 144 * 16)
    per_layer = max(nvlink / (900e9 * 0.88), nic / (50e9 * A2A_NIC_EFFICIENCY)) + 2 * A2A_LATENCY_S["RDMA"]
    assert a2a_seconds(DS, b200, staged, 144 * 16) == pytest.approx(29 * per_layer, rel=1e-9)


def test_group_step_by_hand_decode_on_one_hgx_b200_node() -> None:
    b200 = GPUS["B200"]
    par = Parallelism(dp=8, expert_parallel=True, a2a="low_latency", domain_gpus=8)
    tokens, ctx = 8 * 64, 2048
    attn = 4.0 * DS.layers * DS.q_heads * DS.attn_head_dim * ctx * tokens
    compute = (2 * 37e9 * tokens + attn) / (8 * 4.5e15 * MFU)
    weights = DS.dense_bytes + DS.expert_params * DS.experts_touched(tokens) / 8
    memory = (weights + tokens * ctx * DS.kv_bytes_per_token / 8) / (8e12 * HBM_EFFICIENCY)
    comm = a2a_seconds(DS, b200, par, tokens)
    expected = max(compute, memory) + comm + STEP_OVERHEAD_S
    assert group_step_seconds(DS, b200, par, tokens=tokens, attn_flops=attn, kv_tokens_read=tokens * ctx) == (
        pytest.approx(expected, rel=1e-9)
    )
    overlapped = Parallelism(dp=8, expert_parallel=True, a2a="low_latency", overlap=True)
    hidden = group_step_seconds(DS, b200, overlapped, tokens=tokens, attn_flops=attn, kv_tokens_read=tokens * ctx)
    assert hidden == pytest.approx(max(compute, memory, comm) + STEP_OVERHEAD_S, rel=1e-9)
    assert group_step_seconds(DS, b200, par, tokens=0, attn_flops=0, kv_tokens_read=0) == 0.0


def test_group_step_of_plain_tensor_parallel_matches_the_single_engine_model() -> None:
    b200, attn = GPUS["B200"], attention_flops(LLAMA, 0, 4096)
    grouped = group_step_seconds(LLAMA, b200, Parallelism(tp=8), tokens=4096, attn_flops=attn, kv_tokens_read=4096)
    single = step_seconds(LLAMA, b200, tp=8, tokens=4096, attn_flops=attn, kv_tokens_read=4096)
    assert grouped == pytest.approx(single, rel=1e-9)


def test_more_gpus_per_replica_shorten_a_big_prefill_but_nics_cap_wide_ep_on_hgx() -> None:
    h800, gb200 = resolve_topology("HGX-H800"), resolve_topology("GB200-NVL72")
    tokens = 32 * 16384
    attn = attention_flops(DS, 0, 4096) * tokens / 4096

    def step(topology: Topology, overlap: bool = False) -> float:
        par = replica_parallelism(topology, dp=32, expert_parallel=True, overlap=overlap)
        return group_step_seconds(DS, topology.gpu, par, tokens=tokens, attn_flops=attn, kv_tokens_read=tokens)

    assert step(gb200) < step(h800) / 2
    seed_per_gpu = 73_700 / 8  # the seed's DeepSeek prefill figure, per H800
    assert 0.5 < 16384 / step(h800, overlap=True) / seed_per_gpu < 2.0


def test_a_lone_prompt_sits_on_one_data_parallel_rank() -> None:
    b200, par = GPUS["B200"], Parallelism(dp=16, expert_parallel=True, a2a="high_throughput", domain_gpus=8)
    attn = attention_flops(DS, 0, 8192)

    def step(busiest: int | None) -> float:
        return group_step_seconds(DS, b200, par, tokens=8192, attn_flops=attn, kv_tokens_read=8192, busiest=busiest)

    assert step(8192) > 4 * step(None) and step(8192 // 16) == step(None)
    # the rank computes its dense layers and attention alone, the experts' work is spread over all 16 GPUs
    compute, _, comm = group_step_parts(DS, b200, par, tokens=8192, attn_flops=attn, kv_tokens_read=8192, busiest=8192)
    routed = DS.expert_params * 8 / 256
    expected = (2 * (37e9 - routed) * 8192 + attn) / (4.5e15 * MFU) + 2 * routed * 8192 / (16 * 4.5e15 * MFU)
    assert compute == pytest.approx(expected, rel=1e-9)
    assert comm == pytest.approx(a2a_seconds(DS, b200, par, 8192 * 16), rel=1e-9)  # one rank sends all of it
