"""The Markdown of bench/results/kv-tiers.md: the four arms per shape and load, and their ratios."""

from __future__ import annotations

from typing import Any

from bench.tiers.suite import ARMS, BASELINE, LLMD, LLMD_ALL, LLMD_WEIGHT, OFFLOAD_BYTES


def _s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _x(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num is not None and den else "-"


def table(res: dict[str, Any]) -> list[str]:
    out = [
        "| shape | load | arm | completed | TTFT mean s | TTFT p90 s | GPU hit | reloaded (CPU) | output tok/s"
        " | in flight | TTFT mean vs GPU only | TTFT p90 vs GPU only | throughput vs GPU only |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        base = next(a for a in row["arms"] if a["label"] == BASELINE)
        for a in row["arms"]:
            out.append(
                f"| {row['shape']} | {row['load']} | {a['label']} | {a['completed']} | {_s(a.get('ttft_mean_s'))}"
                f" | {_s(a.get('ttft_p90_s'))} | {a.get('gpu_hit_ratio', 0):.1%} | {a.get('cpu_hit_ratio', 0):.1%}"
                f" | {a.get('output_tokens_per_s', 0):,.0f} | {a.get('concurrency', 0):.0f}"
                f" | {_x(a.get('ttft_mean_s'), base.get('ttft_mean_s'))}"
                f" | {_x(a.get('ttft_p90_s'), base.get('ttft_p90_s'))}"
                f" | {_x(a.get('output_tokens_per_s'), base.get('output_tokens_per_s'))} |"
            )
    return out


def _over_sweep(rows: list[dict[str, Any]], label: str, key: str) -> float:
    """The mean over the sweep's rates of one arm's figure."""
    return sum(float(next(a for a in r["arms"] if a["label"] == label)[key]) for r in rows) / len(rows)


def sweep_means(res: dict[str, Any]) -> list[str]:
    """llm-d's figure: mean TTFT over the 5-40 QPS sweep (the mean of the four rates' means), with the
    mean of the four rates' p90 TTFT beside it."""
    out = [
        "| shape | arm | mean TTFT over 5-40 QPS, s | vs GPU only | GPU only / arm"
        " | mean of the p90 TTFTs, s | vs GPU only |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape in (LLMD, LLMD_ALL):
        rows = [r for r in res["rows"] if r["shape"] == shape]
        means = {arm.label: _over_sweep(rows, arm.label, "ttft_mean_s") for arm in ARMS}
        p90s = {arm.label: _over_sweep(rows, arm.label, "ttft_p90_s") for arm in ARMS}
        for label, m in means.items():
            out.append(
                f"| {shape} | {label} | {_s(m)} | {_x(m, means[BASELINE])} | {_x(means[BASELINE], m)}"
                f" | {_s(p90s[label])} | {_x(p90s[label], p90s[BASELINE])} |"
            )
    return out


def render(res: dict[str, Any], header: str, reading: str) -> str:
    gib = OFFLOAD_BYTES >> 30
    out = [
        header,
        "",
        "gpt-oss-120b on HGX-H200 (the simulator's H200: 141 GB HBM, 64 GB/s host link per GPU, reloads at 80% of"
        " it), 8 prefill replicas of TP1 and 2 decode replicas of TP4, simulated by `xpyd simulate`'s engine with the"
        " product's router (kv-aware, default scorers `tiers,recent,rendezvous`, its index fed by the engines' KV"
        " events with GPU and CPU media, 50 ms late). GPU KV as the simulator sizes it:"
        f" {res['prefill_kv_tokens']:,} tokens over the prefill pool, {res['decode_kv_tokens']:,} over the decode"
        f" pool ({res['kv_bytes_per_token']:,} bytes per token). Arms, over the same requests in the same run:"
        f" GPU only (no CPU tier); CPU tier, unpriced ({gib} GiB of host memory per prefill replica,"
        " `tier_pricing=False`: the router counts CPU-held blocks as nothing); CPU tier, llm-d rule (the same tier,"
        f" a CPU-held block counted {LLMD_WEIGHT:g} of a GPU-held one whatever its reload costs: the router's"
        " `--cpu-tier-weight`); CPU tier, priced (the same tier, a CPU-held block counted as the share of its"
        " recompute a reload saves). Decode replicas have no CPU tier.",
        "",
        f"Shapes: llm-d's prefix groups (16K-token shared prefix + ~256-token question, ~256 output tokens; every"
        f" group asked for once first, not measured; then uniformly random groups, Poisson arrivals) with"
        f" {res['groups']} groups (1.32x the prefill pool's KV) and {res['groups_all']} groups (1.32x both pools' KV);"
        " 49K-token private prefixes (each asked about once, half of them a second time 15-105 s later; measured"
        " after 30 s); multi-turn chat (8 shared 4K system prompts, ~8 turns of ~1.5K user + ~400 answer tokens,"
        " 30 s think time; measured after 60 s). Hit columns: prompt tokens found on the GPU / reloaded from the"
        " CPU tier, over prompt tokens. In flight: mean requests in the system (Little's law).",
        "",
        "## Every run",
        "",
        *table(res),
        "",
        "## llm-d's figure: TTFT over the QPS sweep",
        "",
        *sweep_means(res),
        "",
        reading,
    ]
    return "\n".join(out) + "\n"
