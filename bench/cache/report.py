"""Markdown tables of the cache-routing suite: per scenario, per router replica count, live and CPU."""

from __future__ import annotations

from typing import Any

from bench.cache.suite import REPLICAS, SEEDS, XPYD


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def suite_md(res: dict[str, Any], header: str) -> str:
    out = [header, ""]
    out += [
        "Simulated runs (`xpyd simulate`'s engine), all routers over the same requests: the synthetic shapes are"
        f" drawn with seeds {SEEDS[0]}-{SEEDS[-1]} ({len(SEEDS)} runs each, the tables give the mean, the verdict"
        " counts the seeds: near capacity the agent and 28 req/s chat shapes are bistable, and one run that tips"
        " into cache thrash moves a mean of three by ten points),"
        " the traces replayed once. `xpyd kv-aware + KV events` is the product with its index fed by the workers'"
        " KV events (the cache as it is, evictions included); `own routes only` is the same policy without events."
        " The peers are emulations of their published rules (bench/cache/peers.py). Hit ratio: prompt tokens"
        " served from a worker's prefix cache / prompt tokens. Verdict: xpyd's hit ratio >= the best peer's and"
        " TTFT p99 <= the best peer's.",
        "",
        "| scenario | shape | deployment | req/s | working set (tokens) | cache/worker | cache / working set"
        " | ideal hit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in res["suite"]:
        out.append(
            f"| {e['scenario']} | {e['shape']} | {e['deployment']} | {e['rate']} | {e['working_set_tokens']:,} | "
            f"{e['cache_tokens_per_worker']:,} | {e['cache_vs_working_set'] or '-'} | {_pct(e['ideal_hit_ratio'])} |"
        )
    out += [
        "",
        "| scenario | router | prefix hit | TTFT p50 s | TTFT p99 s | SLO att. | imbalance |",
        "|---|---|---|---|---|---|---|",
    ]
    met_hit = met_p99 = 0
    for e in res["suite"]:
        for r in e["rows"]:
            name = f"**{r['label']}**" if r["label"] == XPYD else r["label"]
            out.append(
                f"| {e['scenario']} | {name} | {_pct(r['prefix_hit_ratio'])} | {_s(r['ttft_p50_s'])} | "
                f"{_s(r['ttft_p99_s'])} | {_pct(r['slo_attainment'])} | {_ratio(r['imbalance'])} |"
            )
        met_hit += e["hit_ok"]
        met_p99 += e["p99_ok"]
    out += [
        "",
        "## Verdict per scenario",
        "",
        "| scenario | xpyd hit | best peer hit | difference, points | hit >= best | xpyd p99 s | best peer p99 s"
        " | p99 <= best | seeds: hit >= best | seeds: p99 <= best |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in res["suite"]:
        ours = e["rows"][0]
        diff = 100 * (ours["prefix_hit_ratio"] - e["best_peer_hit"])
        peer = _short(e.get("best_peer_hit_label", ""))
        out.append(
            f"| {e['scenario']} | {_pct(ours['prefix_hit_ratio'])} | {_pct(e['best_peer_hit'])}{peer} | {diff:+.2f} | "
            f"{'yes' if e['hit_ok'] else 'NO'} | {_s(ours['ttft_p99_s'])} | {_s(e['best_peer_p99'])} | "
            f"{'yes' if e['p99_ok'] else 'NO'} | {_seeds(e, 'hit_ok')} | {_seeds(e, 'p99_ok')} |"
        )
    n = len(res["suite"])
    runs = [run for e in res["suite"] for run in e.get("seeds", [])]
    out += [
        "",
        f"On the mean: hit ratio at least the best peer's in {met_hit}/{n} scenarios; TTFT p99 no worse in"
        f" {met_p99}/{n}. Run by run: hit ratio in {sum(r['hit_ok'] for r in runs)}/{len(runs)}, TTFT p99 in"
        f" {sum(r['p99_ok'] for r in runs)}/{len(runs)}.",
    ]
    out += ["", "Per seed (xpyd / best peer, hit ratio and TTFT p99):", ""]
    out += [
        "| scenario | seed | xpyd hit | best peer hit | xpyd p99 s | best peer p99 s |",
        "|---|---|---|---|---|---|",
    ]
    for e in res["suite"]:
        for run in e.get("seeds", []):
            ours = run["rows"][0]
            out.append(
                f"| {e['scenario']} | {run['seed']} | {_pct(ours['prefix_hit_ratio'])} | {_pct(run['best_peer_hit'])}"
                f"{_short(run['best_peer_hit_label'])} | {_s(ours['ttft_p99_s'])} | {_s(run['best_peer_p99'])} |"
            )
    missed = [e for e in res["suite"] if not (e["hit_ok"] and e["p99_ok"]) and e["scenario"] in NOTES]
    if missed:
        out += ["", "## Rows that miss, and why", ""]
        out += [f"- **{e['scenario']}**: {NOTES[e['scenario']]}" for e in missed]
    return "\n".join(out) + "\n"


def replicas_md(rows: list[dict[str, Any]], header: str) -> str:
    out = [header, ""]
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    for name in scenarios:
        out += [
            f"## {name}",
            "",
            "| index and load | "
            + " | ".join(f"{n} replica{'s' * (n > 1)}" for n in REPLICAS)
            + " | within bounds (hit -2% rel., SLO -0.5 pt) |",
            "|---" * (len(REPLICAS) + 2) + "|",
        ]
        for label in dict.fromkeys(r["label"] for r in rows if r["scenario"] == name):
            mine = {r["replicas"]: r for r in rows if r["scenario"] == name and r["label"] == label}
            one = mine[1]
            cells = [f"{_pct(mine[n]['prefix_hit_ratio'])} / {_pct(mine[n]['slo_attainment'])}" for n in REPLICAS]
            ok = all(
                mine[n]["prefix_hit_ratio"] >= one["prefix_hit_ratio"] * 0.98
                and mine[n]["slo_attainment"] >= one["slo_attainment"] - 0.005
                for n in REPLICAS
            )
            out.append(f"| {label} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} |")
        out += ["", "Cells: prefix hit ratio / SLO attainment.", ""]
    return "\n".join(out) + "\n"


def live_md(res: dict[str, Any], header: str) -> str:
    """The live runs: the real peer routers beside xpyd, and xpyd's router replicas."""
    out = [header, ""]
    when = res.get("measured", {})  # section -> when it was run (a run may redo one section only)
    peers = res.get("live") or []
    if peers:
        out += [
            "## The real routers on emulated workers (chat, 4 workers, caches half the working set)",
            "",
            *([f"Measured {when['live']}.", ""] if "live" in when else []),
            "Streamed, answers capped at 32 tokens; hit ratio from the workers' own counters. sglang-router and"
            " vllm-router are the PyPI packages (`.[bench]`); vllm-router's kv_aware needs a HuggingFace"
            " tokenizer and is simulated only (cache-suite.md).",
            "",
            "| scenario | router | ok/n | prefix hit | TTFT p50 s | TTFT p99 s | TTFT <= 2 s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in peers:
            if "error" in r:
                out.append(f"| {r['scenario']} | {r['router']} | failed: {r['error'][:120]} | | | | |")
                continue
            out.append(
                f"| {r['scenario']} | {r['router']} | {r['ok']}/{r['n']} | {r['prefix_hit_ratio']:.1%} | "
                f"{r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | {r['ttft_attainment']:.1%} |"
            )
    reps = res.get("live_replicas") or []
    if reps:
        out += [
            "",
            "## xpyd router replicas (`xpyd load` spreading requests over them)",
            "",
            *([f"Measured {when['live_replicas']}.", ""] if "live_replicas" in when else []),
            "KV events from every worker to every replica; replicas exchange in-flight counts and routes every 100 ms."
            " Traces replayed `speedup` times faster on emulators running as much faster; latencies shown in modelled"
            " seconds (measured x speedup), SLO: TTFT <= 2 s and mean ITL <= 100 ms modelled.",
            "",
            "| trace | replicas | ok/n | prefix hit | TTFT p50 s | TTFT p99 s | SLO att. |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in reps:
            if "error" in r:
                out.append(f"| {r['scenario']} | {r['replicas']} | failed: {r['error'][:120]} | | | | |")
                continue
            x = r["speedup"]  # latencies back in modelled seconds
            out.append(
                f"| {r['scenario']} | {r['replicas']} | {r['ok']}/{r['requests']} | {r['prefix_hit_ratio']:.1%} | "
                f"{r['ttft_p50_s'] * x:.3f} | {r['ttft_p99_s'] * x:.3f} | {r['slo_attainment']:.1%} |"
            )
    return "\n".join(out) + "\n"


def _ratio(v: float | None) -> str:
    return f"{v:.3f}" if v else "-"


def _seeds(entry: dict[str, Any], key: str) -> str:
    runs = entry.get("seeds", [])
    return f"{sum(r[key] for r in runs)}/{len(runs)}" if runs else "-"


def _short(label: str) -> str:
    return f" ({label.removesuffix(' + KV events')})" if label else ""


# What the per-request traces of a missing row showed (the policy's choices against the peer's); a
# note is printed only while its row misses.
NOTES = {
    "mooncake-conv-small": "sglang-router cache_aware's higher hit ratio comes with an imbalance: it sends"
    " 3.7x as many prompt tokens to one of the two prefill workers as to the other (simulator counters),"
    " so the quieter worker's cache keeps a longer window of the trace and hits more (10% there, 5% on"
    " the busy one). Matching it would take the same overload, which costs the peer TTFT p99 21 s and"
    " 47% SLO attainment against xpyd's 4.4 s and 94%.",
    "rag-large": "the margin here is a tenth of a point either way on each draw. What separates the two"
    " is the load bound: sglang-router's rule never moves a document's prompts off its holder (TTFT p99"
    " 0.67 s against xpyd's 0.50 s), xpyd moves them once the holder has 3x the pool's mean in flight, 2x"
    " while it took more than 1.2x the pool's mean of blocks lately (policy/kv.py). Without that 2x the"
    " RAG rows gain a few hundredths of a point and 14 of 60 agent draws fall into cache thrash (1 with"
    " it, 5 with the 2x bound for every holder). Tried and dropped: the sticky bound at 2.5x or 1.6x, 3x"
    " on the uncached-work bound alone, a larger work slack, ties in rank order instead of the least"
    " work, a home per document kept after eviction, counting only new blocks in PrefixIndex.recent"
    " (agents thrash more).",
    "rag-small": "see rag-large; the closest row of the suite (the mean within a hundredth of a point,"
    " draws on both sides); TTFT p99 0.50 s vs 0.78 s.",
}
