"""The simulator prices a data/expert-parallel replica as the emulator does: ranks in lockstep plus the all-to-all."""

from __future__ import annotations

import pytest

from xpyd_perf import MODELS, TOPOLOGIES
from xpyd_perf.timing import group_step_seconds, step_seconds
from xpyd_sim.perfmodel import PoolPerf, group_parallelism

R1 = MODELS["deepseek-r1"]


@pytest.mark.parametrize(
    ("role", "tp", "gpus", "ep", "expected"),
    [
        ("prefill", 8, 8, False, None),  # plain tensor parallel: the single-engine roofline
        ("prefill", 1, 16, True, ("high_throughput", 16)),
        ("decode", 1, 32, True, ("low_latency", 32)),
        ("worker", 2, 8, False, ("high_throughput", 4)),
    ],
)
def test_group_parallelism_by_role(role: str, tp: int, gpus: int, ep: bool, expected: tuple[str, int] | None) -> None:
    par = group_parallelism(TOPOLOGIES["HGX-B200"], role, tp, gpus, ep)
    assert (None if par is None else (par.a2a, par.dp)) == expected


def test_group_replica_steps_match_the_emulators_formula() -> None:
    topo = TOPOLOGIES["GB200-NVL72"]
    par = group_parallelism(topo, "decode", 1, 32, True)
    perf = PoolPerf(R1, topo.gpu, 1, 32, expert_parallel=True, parallel=par)
    assert par is not None
    got = perf.decode_step_seconds(batch=3200, ctx_total=3200 * 2048)
    ctx = 3200 * 2048
    attn = 4.0 * R1.layers * R1.q_heads * R1.attn_head_dim * ctx
    want = group_step_seconds(R1, topo.gpu, par, tokens=3200, attn_flops=attn, kv_tokens_read=ctx, busiest=100)
    assert got == pytest.approx(want)
    plain = step_seconds(R1, topo.gpu, tp=32, tokens=3200, attn_flops=attn, kv_tokens_read=ctx)
    assert got > plain  # lockstep ranks and the all-to-all cost more than one ideal 32-GPU engine
