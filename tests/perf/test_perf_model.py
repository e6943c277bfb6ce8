"""The performance model against hand-computed figures, including the seeds' ~3% and ~8x."""

from __future__ import annotations

import pytest

from xpyd_perf import (
    GPUS,
    MODELS,
    UnknownGpuError,
    UnknownModelError,
    UnknownTopologyError,
    attention_flops,
    break_even,
    decode_step_seconds,
    handoff_lanes,
    handoff_seconds,
    kv_bytes,
    link_bandwidth,
    path_between,
    prefill_seconds,
    resolve_gpu,
    resolve_model,
    resolve_topology,
    stall_seconds,
    suggest_xpyd,
)

LLAMA70 = resolve_model("llama-3.1-70b")
B200 = GPUS["B200"]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("llama-3.1-70b", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("META-LLAMA/META-LLAMA-3.1-70B-INSTRUCT", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ],
)
def test_resolve_model_accepts_keys_and_hf_names(name: str, key: str) -> None:
    assert resolve_model(name).key == key


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UnknownModelError) as err:
        resolve_model("mistral-7b")
    assert isinstance(err.value, ValueError)
    for key in MODELS:
        assert key in str(err.value)


@pytest.mark.parametrize(
    ("name", "gpu", "domain"),
    [("HGX-B200", "B200", 8), ("gb200-nvl72", "GB200", 72), ("H100", "H100", 8), ("NVL72", "GB200", 72)],
)
def test_resolve_topology(name: str, gpu: str, domain: int) -> None:
    topo = resolve_topology(name)
    assert (topo.gpu.name, topo.domain_gpus) == (gpu, domain)


def test_unknown_topology_and_gpu_list_valid_names() -> None:
    with pytest.raises(UnknownTopologyError, match="HGX-B200, GB200-NVL72, H100"):
        resolve_topology("DGX-1")
    with pytest.raises(UnknownGpuError, match="B200"):
        resolve_gpu("A100")
    assert resolve_gpu("NVIDIA-GB200").name == "GB200"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("llama-3.1-8b", 32 * 8 * 128 * 2 * 2),
        ("llama-3.1-70b", 80 * 8 * 128 * 2 * 2),
        ("qwen3-32b", 64 * 8 * 128 * 2 * 2),
        ("deepseek-v3", 61 * 576 * 2),
        ("gpt-oss-120b", 36 * 8 * 64 * 2 * 2),
    ],
)
def test_kv_bytes_per_token_from_shapes(key: str, expected: int) -> None:
    assert MODELS[key].kv_bytes_per_token == expected
    assert kv_bytes(MODELS[key], 1000) == 1000 * expected
    assert kv_bytes(MODELS[key], 10, kv_bytes_per_token=7) == 70


def test_prefill_32k_llama70b_on_8_b200() -> None:
    # 2 x 70.6e9 x 32768 dense + 4 x 80 x 64 x 128 x (32768 x 32769 / 2) attention FLOPs
    flops = 2 * 70.6e9 * 32768 + 4 * 80 * 64 * 128 * (32768 * 32769 / 2)
    expected = flops / (8 * 2.25e15 * 0.40) + 0.0008
    assert prefill_seconds(LLAMA70, B200, 32768, 0, tp=8) == pytest.approx(expected, rel=1e-9)


def test_cached_tokens_shorten_prefill() -> None:
    full = prefill_seconds(LLAMA70, B200, 8192, 0, tp=8)
    half = prefill_seconds(LLAMA70, B200, 8192, 4096, tp=8)
    assert half < 0.6 * full
    assert prefill_seconds(LLAMA70, B200, 8192, 8192, tp=8) == 0.0
    assert attention_flops(LLAMA70, 0, 2) == 4 * 80 * 64 * 128 * 3


def test_decode_step_is_weights_over_hbm() -> None:
    weights = 70.6e9 * 2
    expected = (weights + 1000 * 327_680) / (8 * 8e12 * 0.80) + 0.0008
    assert decode_step_seconds(LLAMA70, B200, 1, 1000, tp=8) == pytest.approx(expected, rel=1e-9)
    assert decode_step_seconds(LLAMA70, B200, 64, 4000, tp=8) > decode_step_seconds(LLAMA70, B200, 1, 4000, tp=8)


def test_moe_reads_active_experts_at_batch_one_and_all_at_large_batch() -> None:
    ds = MODELS["deepseek-v3"]
    assert ds.weight_bytes_read(1) == pytest.approx(37e9, rel=1e-6)
    assert ds.weight_bytes_read(4096) == pytest.approx(671e9, rel=1e-3)


def test_seed_32k_llama70b_over_400g_nics_costs_about_3_percent() -> None:
    size = kv_bytes(LLAMA70, 32768)
    assert size == 10_737_418_240
    transfer = handoff_seconds(size, "RDMA", B200, lanes=8)
    assert transfer == pytest.approx(0.001 + size / (8 * 50e9), rel=1e-9)
    ratio = transfer / prefill_seconds(LLAMA70, B200, 32768, 0, tp=8)
    assert 0.02 < ratio < 0.045


def test_seed_nvlink_is_about_8x_a_nic() -> None:
    h100 = GPUS["H100"]
    assert link_bandwidth(h100, "NVLink") / link_bandwidth(h100, "RDMA") == pytest.approx(8, rel=0.1)
    size = kv_bytes(LLAMA70, 32768)
    assert handoff_seconds(size, "RDMA", h100) / handoff_seconds(size, "NVLink", h100) == pytest.approx(8, rel=0.1)


@pytest.mark.parametrize(
    ("key", "tp_p", "tp_d", "dp", "lanes"),
    [
        ("llama-3.1-70b", 8, 8, False, 8),
        ("llama-3.1-70b", 8, 4, False, 4),
        ("llama-3.1-70b", 8, 8, True, 1),
        ("deepseek-v3", 8, 8, False, 1),
        ("llama-3.1-8b", 1, 1, False, 1),
    ],
)
def test_handoff_lanes(key: str, tp_p: int, tp_d: int, dp: bool, lanes: int) -> None:
    assert handoff_lanes(MODELS[key], tp_p, tp_d, dp) == lanes


@pytest.mark.parametrize(
    ("a", "b", "path"),
    [("node-1", "node-1", "NVLink"), ("clique.1", "clique.2", "RDMA"), (None, None, "RDMA"), ("", "", "RDMA")],
)
def test_path_between_domains(a: str | None, b: str | None, path: str) -> None:
    assert path_between(a, b) == path


def test_stall_is_near_zero_for_short_prompts_and_near_prefill_for_long() -> None:
    assert stall_seconds(LLAMA70, B200, 64, tp=8) < 0.0005
    long_prefill = prefill_seconds(LLAMA70, B200, 32768, 0, tp=8)
    assert stall_seconds(LLAMA70, B200, 32768, tp=8) == pytest.approx(long_prefill, rel=0.05)


@pytest.mark.parametrize(
    ("topology", "prompt", "path", "disaggregate"),
    [
        ("HGX-B200", 32768, "RDMA", True),
        ("HGX-B200", 2048, "RDMA", True),
        ("GB200-NVL72", 32768, "NVLink", True),
        ("HGX-B200", 64, "RDMA", False),
        ("H100", 128, "RDMA", False),
    ],
)
def test_break_even_verdicts(topology: str, prompt: int, path: str, disaggregate: bool) -> None:
    verdict = break_even("meta-llama/Llama-3.1-70B-Instruct", topology, prompt)
    assert (verdict.kv_path, verdict.disaggregate) == (path, disaggregate)
    assert verdict.disaggregate == (verdict.transfer_seconds < verdict.stall_seconds)
    assert "disaggregate" in verdict.summary() if disaggregate else "colocate" in verdict.summary()
    assert f"{prompt}-token" in verdict.summary()


def test_break_even_honours_kv_override_and_rejects_bad_replicas() -> None:
    assert break_even("llama-3.1-70b", "HGX-B200", 1000, 8, kv_bytes_per_token=1).kv_bytes == 1000
    with pytest.raises(ValueError, match="does not fit HGX-B200"):
        break_even("llama-3.1-70b", "HGX-B200", 1000, gpus_per_replica=16)
    with pytest.raises(ValueError, match="prompt_tokens"):
        break_even("llama-3.1-70b", "HGX-B200", 0)
    assert break_even("llama-3.1-70b", "GB200-NVL72", 1000, gpus_per_replica=16).gpus_per_replica == 16


def test_suggestion_scales_with_rate() -> None:
    low = suggest_xpyd("llama-3.1-70b", "HGX-B200", 8192, 256, rate=1)
    high = suggest_xpyd("llama-3.1-70b", "HGX-B200", 8192, 256, rate=50)
    assert high.prefill_replicas > low.prefill_replicas
    assert high.decode_replicas >= low.decode_replicas
    assert high.label == f"{high.prefill_replicas}P{high.decode_replicas}D"
    with pytest.raises(ValueError, match="positive"):
        suggest_xpyd("llama-3.1-70b", "HGX-B200", 8192, 256, rate=0)
