"""The Markdown of bench/results/dp-ranks.md: both modes per deployment and workload, then their ratios."""

from __future__ import annotations

from typing import Any

from bench.dp.suite import TOOLAGENT


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _s(v: float) -> str:
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _ratio(num: float, den: float) -> str:
    return f"{num / den:.2f}x" if den > 0 else "-"


INTRO = (
    "DeepSeek-R1-0528, wide expert parallel (DP attention, one GPU per rank), disaggregated, simulated by"
    " `xpyd simulate`'s engine with the product's router (kv-aware policy, its index fed by the engines' KV events"
    " 50 ms late). `ranks`: the router sees one target per data-parallel rank (`URL#dpR`, each with its own"
    " prefix index, load and KV events) and pins the rank (`X-data-parallel-rank`), as it now does for vLLM."
    " `engine`: the router sees each replica as one target (its index the union of the ranks' events) and vLLM's"
    " API server picks the rank with the lowest waiting x 4 + running (v0.11 DPLBAsyncMPClient). Each rank has"
    " its own prefix cache in 1/D of the replica's KV; step times are the same model in both modes (the"
    " replica's ranks in lockstep). Both modes replay the same requests in the same run; the synthetic shapes"
    " (bench/cache/workloads.py) are drawn with seeds {seeds} and the tables give the means; the Mooncake"
    " conversation trace is replayed {trace}. Prefix hit: prompt tokens served from a rank's cache / prompt"
    " tokens. Tokens computed: prompt tokens computed on any worker (the kv-aware policy also prefills on"
    " decode when that is cheaper). Prefill GPU-s: the prefill pool's busy step time x its GPUs. SLO: TTFT"
    " <= 2 s and mean ITL <= 100 ms."
)


def render(res: dict[str, Any], header: str) -> str:
    seeds = ", ".join(str(s) for s in res["seeds"])
    trace = "up to its first 3,000 requests (--quick)" if res["quick"] else "whole"
    out = [header, "", INTRO.format(seeds=seeds, trace=trace), ""]
    out += ["| deployment | GPUs | prefill | decode |", "|---|---|---|---|"]
    for d in res["deployments"]:
        out.append(f"| {d.name} | {d.gpus} | {d.prefill[0]} x DP{d.prefill[1]} | {d.decode[0]} x DP{d.decode[1]} |")
    out += ["", "## Ranks vs engine: ratios (same requests, same run)", ""]
    out += [
        "| deployment | workload | hit ranks | hit engine | hit ranks / engine | TTFT p50 engine / ranks"
        " | TTFT p99 engine / ranks | SLO ranks - engine, points | tokens computed ranks / engine"
        " | prefill GPU-s ranks / engine |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        r, e = row["ranks"], row["engine"]
        out.append(
            f"| {row['deployment']} | {row['workload']} | {_pct(r['prefix_hit_ratio'])} | {_pct(e['prefix_hit_ratio'])}"
            f" | {_ratio(r['prefix_hit_ratio'], e['prefix_hit_ratio'])} | {_ratio(e['ttft_p50_s'], r['ttft_p50_s'])}"
            f" | {_ratio(e['ttft_p99_s'], r['ttft_p99_s'])}"
            f" | {100 * (r['slo_attainment'] - e['slo_attainment']):+.1f}"
            f" | {_ratio(r['tokens_computed'], e['tokens_computed'])}"
            f" | {_ratio(r['prefill_gpu_s'], e['prefill_gpu_s'])} |"
        )
    out += ["", "## Each mode", ""]
    out += [
        "| deployment | workload | requests | mode | prefix hit | TTFT p50 s | TTFT p99 s | SLO att. | ITL p99 ms"
        " | tokens computed (M) | prefill GPU-s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        for mode in ("ranks", "engine"):
            m = row[mode]
            out.append(
                f"| {row['deployment']} | {row['workload']} | {row['requests']:,} | {mode}"
                f" | {_pct(m['prefix_hit_ratio'])} | {_s(m['ttft_p50_s'])} | {_s(m['ttft_p99_s'])}"
                f" | {_pct(m['slo_attainment'])} | {1000 * m['itl_p99_s']:.1f} | {m['tokens_computed'] / 1e6:.1f}"
                f" | {m['prefill_gpu_s']:,.0f} |"
            )
    span = "120 s" if res["quick"] else "{:.0f} s"
    notes = [
        "Workloads: " + "; ".join(
            f"{w.name}: " + (f"`{w.kind}` shape at {w.rate:g} req/s for {span.format(w.duration_s)}" if w.rate
                             else "trace")
            for w in res["workloads"]
        ) + ".",
    ]  # fmt: skip
    if res["skipped"]:
        notes.append(
            f"Skipped (not in this checkout): {', '.join(res['skipped'])}; Mooncake's tool-agent trace would be read"
            f" from `{TOOLAGENT.relative_to(TOOLAGENT.parents[2])}`."
        )
    notes.append(
        "Reading: on the synthetic shapes `engine` loses more than hits. Its index holds the union of a replica's"
        " ranks, so the kv-aware policy sees a warm decode replica and sends the turn there directly (decode-side"
        " prefill); the API server then balances it onto a rank that lacks the history, and the whole prompt is"
        " computed inside the decode replica's lockstep step, stalling every rank's decode (ITL p99 in seconds)."
        " On the Mooncake trace TTFT p99 stays near 27 s in both modes: its longest prompts, each computed on one"
        " rank, pace their replica's steps; the hit ratio and TTFT p50 are where the modes differ."
    )
    notes.append(
        "Caveats: vLLM's API server balances on counts its coordinator refreshes every 100 ms plus its own"
        " increments; the simulation uses the live counts, which helps `engine`. One prompt's chunk may exceed"
        " vLLM's per-rank token budget in the timing model (unchanged here), so long prompts pace a replica's step"
        " as one rank's work."
    )
    return "\n".join(out) + "\n\n" + "\n\n".join(notes) + "\n"
