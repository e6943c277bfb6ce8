"""The KV-tier benchmark's runs: every shape under three arms, over the same requests in one process.

Arms: `GPU only` (no CPU tier), `CPU tier, unpriced` (offloading on, the router's `tiers` scorer counts
CPU-held blocks as nothing: tier_pricing=False), `CPU tier, llm-d rule (0.4)` (a CPU-held block counts
0.4 of a GPU-held one, whatever its reload costs: the router's --cpu-tier-weight) and `CPU tier, priced`
(the default: a CPU-held block counts what its reload saves against recomputing it). The router is
the product's kv-aware policy with its default scorers, its index fed by the engines' KV events (GPU
and CPU media), 50 ms late. Figures are taken over the requests that arrive after each shape's warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from bench.tiers import shapes

from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.report import build
from xpyd_sim.request import SimRequest
from xpyd_sim.spec import SimSpec
from xpyd_sim.trace import TraceRequest

OFFLOAD_BYTES = 200 << 30  # host memory per prefill replica for KV (an 8-GPU H200 node has 2 TiB)


@dataclass(frozen=True)
class Arm:
    label: str
    offload_bytes: int
    tier_pricing: bool
    cpu_weight: float | None = None  # a fixed CPU-block weight instead of pricing (llm-d's rule)


LLMD_WEIGHT = 0.4  # llm-d's CPU-aware prefix scoring: a CPU-held block counts 0.4 of a GPU-held one
ARMS = (
    Arm("GPU only", 0, True),
    Arm("CPU tier, unpriced", OFFLOAD_BYTES, False),
    Arm(f"CPU tier, llm-d rule ({LLMD_WEIGHT:g})", OFFLOAD_BYTES, False, LLMD_WEIGHT),
    Arm("CPU tier, priced", OFFLOAD_BYTES, True),
)
BASELINE = ARMS[0].label


@dataclass(frozen=True)
class Case:
    """One row group of the results: a shape at one load, its requests and when measuring starts."""

    shape: str
    load: str
    requests: tuple[TraceRequest, ...]
    measure_from_s: float


def _stats(done: list[SimRequest], since: float) -> dict[str, Any]:
    """Mean and p90 TTFT, hit ratios, throughput and concurrency of the requests arriving from `since`."""
    sel = [r for r in done if r.arrival >= since]
    if not sel:
        return {"completed": 0}
    ttft = np.array([r.first_token - r.arrival for r in sel])
    prompt = sum(r.prompt_tokens for r in sel)
    reloaded = sum(r.reloaded_tokens for r in sel)
    cached = sum(r.cached_tokens for r in sel)
    span = max(r.finished for r in sel) - since
    return {
        "completed": len(sel),
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p90_s": float(np.percentile(ttft, 90)),
        "gpu_hit_ratio": (cached - reloaded) / prompt,
        "cpu_hit_ratio": reloaded / prompt,
        "output_tokens_per_s": sum(r.output_tokens for r in sel) / span if span > 0 else 0.0,
        "requests_per_s": len(sel) / span if span > 0 else 0.0,
        # Little's law over the measured window: requests in flight on average
        "concurrency": sum(r.finished - r.arrival for r in sel) / span if span > 0 else 0.0,
    }


def measure(spec: SimSpec, case: Case, arm: Arm) -> dict[str, Any]:
    cfg = SimConfig(
        router="kv-aware", router_index="events", block_tokens=shapes.BLOCK_TOKENS,
        offload_bytes=arm.offload_bytes, tier_pricing=arm.tier_pricing, cpu_block_weight=arm.cpu_weight,
    )  # fmt: skip
    sim = Simulation(spec, case.requests, cfg)
    done: list[SimRequest] = []
    sim.on_finish = done.append
    wall, cpu = time.perf_counter(), time.process_time()
    sim.run()
    res = build(sim, time.perf_counter() - wall, time.process_time() - cpu)
    row = {"label": arm.label, "arrived": res["requests"], "unfinished": res["unfinished"] + res["rejected"]}
    row |= {"cpu_s": res["cpu_s"], "router_decisions": res["router_decisions"]}
    return row | _stats(done, case.measure_from_s)


RATES = (5.0, 10.0, 20.0, 40.0)
LLMD = "llm-d prefix groups, 1.32x prefill KV"
LLMD_ALL = "llm-d prefix groups, 1.32x all 16 GPUs' KV"


def cases(spec: SimSpec, quick: bool) -> list[Case]:
    out = []
    # as the brief sizes it (the prefill pool's KV), and over every GPU's KV: xpyd's router also
    # sends a prompt whose prefix a decode replica holds straight there, so decode KV caches too
    for shape, groups in ((LLMD, shapes.Groups.sized(spec, 1.32)), (LLMD_ALL, all_gpu_groups(spec))):
        for rate in RATES:
            load, warm = shapes.Groups(rate, 45.0 if quick else 120.0, groups).trace()
            out.append(Case(shape, f"{rate:g} QPS", tuple(load), warm))
    private = shapes.Private(PRIVATE_RATE, 90.0 if quick else 240.0)
    out.append(Case("49K private prefixes", f"{PRIVATE_RATE:g} QPS", tuple(private.trace()), 30.0))
    chat = shapes.Chat(CHAT_RATE, 150.0 if quick else 360.0)
    out.append(Case("multi-turn chat", f"{CHAT_RATE:g} QPS", tuple(chat.trace()), 60.0))
    return out


def all_gpu_groups(spec: SimSpec, ratio: float = 1.32) -> int:
    """Groups of 16K tokens for a working set `ratio` times the KV of both pools."""
    total = shapes.pool_kv_tokens(spec) + shapes.pool_kv_tokens(spec, "decode")
    return -(-int(ratio * total) // 16_384)


# Just past the prefill pool's rate of 49K prompts computed whole (~5.5/s): the queue grows over the
# run, as a closed loop of 128 clients keeps one (the simulator replays open-loop arrivals)
PRIVATE_RATE = 8.0
CHAT_RATE = 20.0


def run(quick: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = log or (lambda _msg: None)
    spec = shapes.deployment()
    wall, cpu = time.perf_counter(), time.process_time()
    rows = []
    for case in cases(spec, quick):
        arms = [measure(spec, case, arm) for arm in ARMS]
        rows.append({"shape": case.shape, "load": case.load, "requests": len(case.requests), "arms": arms})
        say(
            f"{case.shape} {case.load}: "
            + ", ".join(f"{a['label']} TTFT {a.get('ttft_mean_s', float('nan')):.2f} s" for a in arms)
        )
    return {
        "rows": rows,
        "groups": shapes.Groups.sized(spec, 1.32),
        "groups_all": all_gpu_groups(spec),
        "prefill_kv_tokens": shapes.pool_kv_tokens(spec),
        "decode_kv_tokens": shapes.pool_kv_tokens(spec, "decode"),
        "kv_bytes_per_token": spec.kv_bytes_per_token or spec.model.kv_bytes_per_token,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "quick": quick,
    }
