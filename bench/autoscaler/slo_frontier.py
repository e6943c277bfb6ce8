"""SLO frontier: every autoscaling policy, a few settings each, on eight loads; attainment against GPU-hours.

    .venv/bin/python bench/autoscaler/slo_frontier.py [--duration 1800] [--quick] [--load NAME]

The simulator replays each load (the Azure conversation and code traces, the Mooncake trace, also
under a TTFT target its longest prompts can meet, a bursty synthetic with a 10x spike, a diurnal
synthetic, and two shapes added after the policy was written: 5x spikes every 6 minutes, a linear
ramp) under xpyd's SLO policy, xpyd's threshold policy and the peers' rules (bench/baselines:
KEDA-style queue rule, llm-d-style saturation rule, Planner-style sla rule, profiled from the
simulator's own step timings). The SLO is TTFT p95 <= 1 s (4 s for the second Mooncake load) and
ITL p95 <= 50 ms for 99 % of requests; a request meets it when its TTFT and its mean ITL are
within the targets. The SLO policy runs with one setting on every load (the stated SLO); its
other points (goal 0.95, 0.999) only trace its frontier. Writes bench/results/autoscaler-slo.md
and bench/results/autoscaler-slo.png.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from xpyd_api.models import SloSpec
from xpyd_operator.autoscaling.policy import AUTOSCALERS
from xpyd_operator.autoscaling.types import Policy
from xpyd_sim import trace as traces
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.metrics import Slo
from xpyd_sim.plots import pyplot
from xpyd_sim.report import build
from xpyd_sim.spec import SimSpec, load

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is not installed: import it from the root
from bench.baselines import register
from bench.baselines.autoscalers import (
    KedaPolicy,
    PlannerPolicy,
    PlannerProfile,
    ReactiveBound,
    SaturationPolicy,
    profile,
)

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "data" / "traces"
SPEC = ROOT / "bench" / "sim" / "llama70b-hgx.yaml"
OUT = ROOT / "bench" / "results" / "autoscaler-slo.md"
PLOT = ROOT / "bench" / "results" / "autoscaler-slo.png"
TTFT_S, ITL_S, PERCENTILE, GOAL = 1.0, 0.05, 95, 0.99
MAX_REPLICAS = 16  # per pool, for every policy
REFERENCES = ("static", "reactive")  # rows that bound what is reachable; not contenders


@dataclass(frozen=True)
class Load:
    name: str
    requests: list[traces.TraceRequest]
    note: str
    ttft_s: float = TTFT_S  # the TTFT target stated for this load (ITL, percentile and goal are the same for all)


@dataclass(frozen=True)
class Setting:
    policy: str  # the family, as the table groups it
    label: str  # the family and its setting
    scaler: str  # the registry name the simulator looks up
    targets: tuple[tuple[str, float], ...] = ()
    goal: float = GOAL  # spec.slo.attainment, for the SLO policy
    default: bool = False
    static: tuple[tuple[str, int], ...] = ()  # a fixed size per pool (the reference row, no autoscaler)


def arrival_times(rate: Callable[[float], float], peak: float, duration: float, rng: random.Random) -> Iterator[float]:
    """Poisson arrival times at `rate(t)` req/s up to `duration`, by thinning a `peak` req/s process. The
    caller shares `rng` and draws each request's lengths from it between two times."""
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return
        if rng.random() <= rate(t) / peak:
            yield t


def shaped(rate: Callable[[float], float], peak: float, duration: float, seed: int) -> Iterator[traces.TraceRequest]:
    """Poisson arrivals at `rate(t)` req/s (thinning under `peak`), log-normal lengths like the synthetic trace's."""
    rng, sigma = random.Random(seed), 0.6
    for seq, t in enumerate(arrival_times(rate, peak, duration, rng)):
        inp = max(1, int(rng.lognormvariate(math.log(2048) - sigma**2 / 2, sigma)))
        out = max(1, int(rng.lognormvariate(math.log(256) - sigma**2 / 2, sigma)))
        yield traces.TraceRequest(t, inp, out, traces.fresh_blocks(inp, seq))


def loads(duration: float) -> list[Load]:
    def trace(name: str, copies: int) -> list[traces.TraceRequest]:
        reqs = [r for r in traces.load(TRACES / name) if r.arrival < duration]
        return list(traces.scaled(reqs, copies, 0)) if copies > 1 else reqs

    def bursty(t: float) -> float:
        return 60.0 if duration * 0.4 <= t < duration * 0.4 + 120 else 6.0

    def diurnal(t: float) -> float:
        return 3.0 + 30.0 * (1 - math.cos(2 * math.pi * t / duration)) / 2

    def recurring(t: float) -> float:
        return 30.0 if t % 360.0 >= 270.0 else 6.0

    def ramp(t: float) -> float:
        return 2.0 + 28.0 * t / duration

    return [
        Load("azure-conv", trace("AzureLLMInferenceTrace_conv.csv", 4), "Azure conversation trace, x4 overlaid"),
        Load("azure-code", trace("AzureLLMInferenceTrace_code.csv", 2), "Azure code trace, x2 overlaid"),
        Load("mooncake", trace("conversation_trace.jsonl", 1), "Mooncake conversation trace, x1"),
        Load(
            "mooncake-4s",
            trace("conversation_trace.jsonl", 1),
            "Mooncake conversation trace, x1, stating TTFT p95 <= 4 s (ITL and goal as above): about 5% of its"
            " prompts take over 1 s to prefill on an idle replica, and 4 s is the smallest whole second every pool"
            " at its bound meets the goal at (the static row)",
            ttft_s=4.0,
        ),
        Load("bursty", list(shaped(bursty, 60.0, duration, 1)), "6 req/s with a 2-minute 10x spike (60 req/s)"),
        Load("diurnal", list(shaped(diurnal, 33.0, duration, 2)), "3 to 33 req/s and back, one cosine period"),
        Load("recurring", list(shaped(recurring, 30.0, duration, 3)), "6 req/s with a 90-s 5x spike every 6 minutes"),
        Load("ramp", list(shaped(ramp, 30.0, duration, 4)), "a linear ramp from 2 to 30 req/s"),
    ]


LOAD_NAMES = ("azure-conv", "azure-code", "mooncake", "mooncake-4s", "bursty", "diurnal", "recurring", "ramp")


def settings(quick: bool) -> list[Setting]:
    out = [
        Setting("static", "static 16P/4D (reference)", "off", static=(("prefill", MAX_REPLICAS), ("decode", 4))),
        Setting("reactive", "reactive bound (reference)", "reactive-bound"),
        Setting("slo", "slo goal 0.99", "slo", goal=GOAL, default=True),
        Setting("slo", "slo goal 0.95", "slo", goal=0.95),
        Setting("slo", "slo goal 0.999", "slo", goal=0.999),
        *(Setting("xpyd", f"xpyd waiting {w:g}", "xpyd", (("prefillWaitingPerReplica", w),)) for w in (1, 2, 4)),
        *(Setting("keda", f"keda waiting {w:g}", f"keda@{w:g}") for w in (2, 5, 10)),
        *(Setting("saturation", f"saturation queue {w:g}", f"saturation@{w:g}") for w in (2, 5, 10)),
        *(Setting("planner", f"planner headroom {h:g}", f"planner@{h:g}") for h in (0.6, 0.8, 1.0)),
    ]
    keep = ("waiting 2", "waiting 5", "queue 5", "1", "(reference)")
    return [s for s in out if s.default or not quick or s.label.endswith(keep)]


def bench_spec(goal: float) -> SimSpec:
    spec = load(SPEC, None, None)
    dep = spec.deployment
    pools = {}
    for role in ("prefill", "decode"):
        pool = getattr(dep, role)
        scaling = pool.autoscaling.model_copy(update={"max_replicas": MAX_REPLICAS})
        pools[role] = pool.model_copy(update={"autoscaling": scaling})
    slo = SloSpec(ttft_seconds=TTFT_S, itl_seconds=ITL_S, percentile=PERCENTILE, attainment=goal)
    return spec.with_deployment(dep.model_copy(update={**pools, "slo": slo}))


def planner_profiles(spec: SimSpec) -> dict[str, PlannerProfile]:
    """Planner's pre-deployment profile, swept from the simulator's own step timings of each pool."""
    perfs = Simulation(spec, [], SimConfig()).perfs
    chunk = SimConfig().token_budget
    out = {}
    for role, perf in perfs.items():

        def prefill_seconds(tokens: int, perf: Any = perf) -> float:
            done, total = 0, 0.0
            while done < tokens:
                new = min(chunk, tokens - done)
                total += perf.step_seconds([(new, done)], 0, 0)
                done += new
            return float(total)

        out[role] = profile(prefill_seconds, perf.decode_step_seconds, perf.kv_capacity_tokens)
    return out


def register_settings(profiles: dict[str, PlannerProfile]) -> None:
    register()
    factories: dict[str, Callable[[], Policy]] = {}
    for w in (2.0, 5.0, 10.0):
        factories[f"keda@{w:g}"] = partial(KedaPolicy, w)
        factories[f"saturation@{w:g}"] = partial(SaturationPolicy, queue_threshold=w)
    for h in (0.6, 0.8, 1.0):
        factories[f"planner@{h:g}"] = partial(PlannerPolicy, profiles, headroom=h)
    factories["reactive-bound"] = ReactiveBound
    AUTOSCALERS.update(factories)


def run(spec: SimSpec, load_: Load, s: Setting) -> dict[str, Any]:
    slo = Slo(load_.ttft_s, ITL_S, PERCENTILE / 100)
    stated = spec.deployment.slo
    if stated is not None and stated.ttft_seconds != load_.ttft_s:
        stated = stated.model_copy(update={"ttft_seconds": load_.ttft_s})
        spec = spec.with_deployment(spec.deployment.model_copy(update={"slo": stated}))
    spec = spec.with_pools(**dict(s.static)) if s.static else spec
    cfg = SimConfig(router=spec.deployment.router.policy, autoscaler=s.scaler, slo=slo, autoscaler_targets=s.targets)
    sim = Simulation(spec, load_.requests, cfg)
    start, cpu = time.perf_counter(), time.process_time()
    sim.run()
    res = build(sim, time.perf_counter() - start, time.process_time() - cpu)
    ttft = np.frombuffer(sim.metrics.ttft, dtype=np.float64)
    return {
        "load": load_.name,
        "policy": s.policy,
        "label": s.label,
        "default": s.default,
        "attainment": res["slo_attainment"],
        "gpu_hours": res["gpu_hours"],
        "ttft_q": float(np.percentile(ttft, PERCENTILE)) if len(ttft) else None,
        "itl_q": sim.metrics.itl.quantile(PERCENTILE / 100),
        "max": res["replicas_max"],
        "meets": (res["slo_attainment"] or 0) >= GOAL,
    }


def resolution(spec: SimSpec) -> float:
    """GPU-hours below which two rows cost the same: one replica (the most GPUs one has) for one autoscaler
    interval, the grid every policy decides on (a decision a step earlier or later moves a row by this)."""
    gpus = max(pool.gpus_per_replica for pool in spec.deployment.pools().values())
    return spec.interval_s * gpus / 3600.0


def dominates(a: dict[str, Any], b: dict[str, Any], tie: float = 0.0) -> bool:
    """Whether row `a` is at least as good as `b` on both axes (GPU-h, attainment) and better on one; GPU-h
    within `tie` of each other count as equal."""
    cheaper, better = a["gpu_hours"] <= b["gpu_hours"] + tie, a["attainment"] >= b["attainment"]
    return bool(cheaper and better and (a["gpu_hours"] < b["gpu_hours"] - tie or a["attainment"] > b["attainment"]))


def verdict(rows: list[dict[str, Any]], tie: float = 0.0) -> str:
    mine = next(r for r in rows if r["default"])
    ref = next((r for r in rows if r["policy"] == "static"), None)
    bound = next((r for r in rows if r["policy"] == "reactive"), None)
    baselines = [r for r in rows if r["policy"] not in ("slo", *REFERENCES)]
    meeting = sorted((r for r in baselines if r["meets"]), key=lambda r: r["gpu_hours"])
    if mine["meets"]:
        out = f"slo mode meets the goal at {mine['gpu_hours']:.1f} GPU-h"
        cheaper = [r for r in meeting if r["gpu_hours"] < mine["gpu_hours"] - tie]
        if cheaper:
            best = cheaper[0]
            out += (
                f", but **{best['label']} meets it for less** ({best['gpu_hours']:.1f} GPU-h at"
                f" {best['attainment']:.2%}, against {mine['attainment']:.2%})"
            )
        elif meeting:
            out += f", the fewest: the cheapest baseline meeting it is {meeting[0]['label']} at"
            out += f" {meeting[0]['gpu_hours']:.1f} GPU-h"
        else:
            out += "; no baseline setting meets it"
    else:
        out = f"slo mode **misses** the goal ({mine['attainment']:.2%} at {mine['gpu_hours']:.1f} GPU-h)"
        if ref is not None and not ref["meets"]:
            out += f"; out of reach on this spec: every pool at its bound throughout reaches {ref['attainment']:.2%}"
        elif bound is not None and not bound["meets"] and not any(r["meets"] for r in rows if r is not ref):
            best = max(r["attainment"] for r in rows if r["policy"] != "static")
            out += (
                f"; out of reach for a policy that reacts to measured load: growing every pool to its bound at"
                f" the first sign reaches {bound['attainment']:.2%}, the best of all {best:.2%}"
            )
        if meeting:
            out += f"; cheapest baseline meeting it: {meeting[0]['label']} {meeting[0]['gpu_hours']:.1f} GPU-h"
    over = [r for r in baselines if dominates(r, mine, tie)]
    if over:
        best = min(over, key=lambda r: r["gpu_hours"])
        return out + (f"; **dominated** by {best['label']} ({best['gpu_hours']:.1f} GPU-h at {best['attainment']:.2%})")
    return out + "; no baseline setting dominates it"


def table(rows: list[dict[str, Any]]) -> str:
    q = PERCENTILE
    head = f"| policy / setting | attainment | meets {GOAL:.0%} | GPU-h | TTFT p{q} s | ITL p{q} ms | max P/D |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"**{r['label']}** (default)" if r["default"] else r["label"]
        itl = "-" if r["itl_q"] is None else f"{r['itl_q'] * 1000:.1f}"
        ttft = "-" if r["ttft_q"] is None else f"{r['ttft_q']:.2f}"
        lines.append(
            f"| {name} | {r['attainment']:.2%} | {'yes' if r['meets'] else 'no'} | {r['gpu_hours']:.1f} | {ttft}"
            f" | {itl} | {r['max']['prefill']}/{r['max']['decode']} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), squeeze=False)
    for ax, (name, rows) in zip(axes[0], results.items(), strict=True):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted((r["gpu_hours"], r["attainment"]) for r in rows if r["policy"] == policy)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        mine = next(r for r in rows if r["default"])
        ax.scatter([mine["gpu_hours"]], [mine["attainment"]], s=120, facecolors="none", edgecolors="black")
        ax.axhline(GOAL, color="grey", linestyle="--", linewidth=1)
        ax.set_title(name)
        ax.set_xlabel("GPU-hours")
        ax.set_ylim(max(0.0, min(r["attainment"] for r in rows) - 0.02), 1.005)
    axes[0][0].set_ylabel("SLO attainment")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=1800.0, help="replay this many seconds of each load")
    p.add_argument("--quick", action="store_true", help="one setting per baseline (a smoke run; writes nothing)")
    p.add_argument("--load", choices=LOAD_NAMES, help="run this load only (prints its table; writes nothing)")
    args = p.parse_args(argv)
    specs = {g: bench_spec(g) for g in (GOAL, 0.95, 0.999)}
    register_settings(planner_profiles(specs[GOAL]))
    tie = resolution(specs[GOAL])
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    every = loads(args.duration)
    for load_ in every:
        if args.load and load_.name != args.load:
            continue
        results[load_.name] = [run(specs[s.goal], load_, s) for s in settings(args.quick)]
        print(load_.name, verdict(results[load_.name], tie), f"({time.perf_counter() - started:.0f}s)", flush=True)
    if args.load:
        print(table(results[args.load]))
    if args.quick or args.load:
        return 0
    notes = {load_.name: load_.note for load_ in every}
    own = [f"{load_.name}: {load_.ttft_s:g} s" for load_ in every if load_.ttft_s != TTFT_S]
    own_ttft = f" ({'; '.join(own)})" if own else ""
    parts = [
        "# Autoscaler benchmark: SLO attainment against GPU-hours\n",
        f"Spec {SPEC.name} (Llama-3.1-70B, TP8 replicas on HGX-B200), each pool 1..{MAX_REPLICAS} replicas from"
        f" 2P4D, a new replica Ready {SimConfig().startup_s:.0f} s after it is asked for; the first"
        f" {args.duration:.0f} s of each load. SLO: TTFT p{PERCENTILE} <= {TTFT_S:g} s{own_ttft} and ITL"
        f" p{PERCENTILE}"
        f" <= {ITL_S * 1000:g} ms for {GOAL:.0%} of requests (attainment: the share of requests whose TTFT and"
        " mean ITL both meet the targets). Every policy sees the pools as the operator's Prometheus queries show"
        " them: counters' rates between the newest two scrapes, latency quantiles over the last minute."
        " The SLO policy runs with the stated SLO on every load (one"
        " setting, marked default); its goal 0.95 and 0.999 points and the baselines' settings trace the"
        " frontier. Command: `.venv/bin/python bench/autoscaler/slo_frontier.py`"
        f" (about {time.perf_counter() - started:.0f} s here). Plot: `autoscaler-slo.png`.\n",
        "## Summary\n",
        *(f"- **{name}**: {verdict(rows, tie)}" for name, rows in results.items()),
        "",
    ]
    parts += [
        "How to read it: the static row is the whole pool bound held for the whole run, the best attainment the"
        " spec can reach on that load (GPU-h for reference, not a contender). The reactive bound row is the SLO"
        " policy sending a pool straight to its bound whenever it would grow it: about the most any policy that"
        " reacts to measured load reaches (also a reference). A baseline setting *dominates*"
        " the SLO mode when it is at least as good on both axes (no more GPU-h, no less attainment) and better"
        f" on one, GPU-h within {tie:.3f} of each other counting as equal (one replica for one autoscaler"
        " interval: a decision one step earlier or later moves a row by that much). In the simulator, as with"
        " the router, a request queues at the prefill replica chosen when it"
        " arrives, so replicas that become Ready during a spike take new requests but not the queue already"
        " built: on a spike shorter than a few start-up times only capacity held beforehand protects TTFT, and"
        " every request that arrives between the spike's start and the first new replica's Ready (a scrape"
        " interval plus the start-up) misses it under any reactive policy, xpyd's included; there, the goal"
        " needs `minReplicas` sized for the spike or a forecast.\n",
    ]
    for name, rows in results.items():
        parts += [f"## {name}: {notes[name]}\n", table(rows), ""]
    text = "\n".join(parts)
    OUT.write_text(text)
    plot(results, PLOT)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
