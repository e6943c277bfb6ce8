"""SLO autoscaling on held-out shapes: five loads written after the SLO policy was, none of them tuned on.

    .venv/bin/python bench/autoscaler/slo_heldout.py [--duration 1800] [--load NAME]

The frontier (slo_frontier.py) is where the SLO policy was developed; these shapes ask how it does on traffic
it has not seen: a sawtooth (3 to 30 req/s over 5 minutes, then back at once, repeated), a step (4 to 24 req/s
at minute 10, held), a bimodal prompt mix (9 chat prompts of 200-900 tokens to one document of 24,000-40,000,
8 req/s), tenants sharing a 4,096-token system prompt on a ramp of 6,000-token prompts (3 to 28 req/s), and a
decode-heavy ramp (3,000 tokens out per request, 2 to 12 req/s). The same spec, SLO and settings as the frontier;
one setting per baseline family (the frontier's middle one). Writes bench/results/autoscaler-slo-heldout.md.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xpyd_sim import trace as traces

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is not installed: import it from the root
from bench.autoscaler import slo_frontier as frontier

OUT = frontier.ROOT / "bench" / "results" / "autoscaler-slo-heldout.md"
Prompt = Callable[[random.Random], int]
SHARED_BASE = 10**9  # block ids of the shared system prompts, apart from every request's own


def lognormal(mean: float, sigma: float = 0.5) -> Prompt:
    return lambda rng: max(1, int(rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)))


def bimodal(rng: random.Random) -> int:
    return int(rng.uniform(24_000, 40_000)) if rng.random() < 0.1 else int(rng.uniform(200, 900))


def arrivals(
    rate: Callable[[float], float],
    peak: float,
    duration: float,
    seed: int,
    prompt: Prompt,
    output_mean: float,
    shared_tokens: int = 0,
) -> Iterator[traces.TraceRequest]:
    """Poisson arrivals at `rate(t)` req/s (thinning under `peak`); prompts drawn by `prompt`, outputs
    log-normal; with `shared_tokens`, each request opens with one of 4 tenants' system prompts."""
    rng = random.Random(seed)
    out = lognormal(output_mean)
    shared = shared_tokens // traces.MOONCAKE_BLOCK_TOKENS
    for seq, t in enumerate(frontier.arrival_times(rate, peak, duration, rng)):
        tokens = prompt(rng)
        blocks = traces.fresh_blocks(tokens, seq)
        if shared:
            first = SHARED_BASE + rng.randrange(4) * 10**6
            blocks = tuple(range(first, first + shared)) + blocks[shared:]
        yield traces.TraceRequest(t, tokens, out(rng), blocks)


def loads(duration: float) -> list[frontier.Load]:
    def sawtooth(t: float) -> float:
        return 3.0 + 27.0 * ((t % 300.0) / 300.0)

    def step(t: float) -> float:
        return 4.0 if t < 600.0 else 24.0

    def ramp(low: float, high: float) -> Callable[[float], float]:
        return lambda t: low + (high - low) * t / duration

    return [
        frontier.Load(
            "sawtooth",
            list(arrivals(sawtooth, 30.0, duration, 11, lognormal(2048), 256)),
            "3 to 30 req/s over 5 minutes, then back to 3 at once, repeated",
        ),
        frontier.Load(
            "step",
            list(arrivals(step, 24.0, duration, 12, lognormal(2048), 256)),
            "4 req/s, then 24 from minute 10 on",
        ),
        frontier.Load(
            "bimodal",
            list(arrivals(lambda t: 8.0, 8.0, duration, 13, bimodal, 256)),
            "8 req/s: 90% chat prompts of 200-900 tokens, 10% documents of 24,000-40,000",
        ),
        frontier.Load(
            "shared-prefix",
            list(arrivals(ramp(3.0, 28.0), 28.0, duration, 14, lognormal(6000), 256, shared_tokens=4096)),
            "3 to 28 req/s of ~6,000-token prompts, each opening with one of 4 tenants' 4,096-token system prompt",
        ),
        frontier.Load(
            "decode-ramp",
            list(arrivals(ramp(2.0, 12.0), 12.0, duration, 15, lognormal(512), 3000)),
            "2 to 12 req/s of ~512-token prompts and ~3,000-token answers",
        ),
    ]


LOAD_NAMES = ("sawtooth", "step", "bimodal", "shared-prefix", "decode-ramp")
# The frontier's references, the SLO policy's stated setting and each baseline family's middle setting.
LABELS = (
    "static 16P/4D (reference)",
    "reactive bound (reference)",
    "slo goal 0.99",
    "xpyd waiting 2",
    "keda waiting 5",
    "saturation queue 5",
    "planner headroom 0.8",
)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=1800.0, help="replay this many seconds of each load")
    p.add_argument("--load", choices=LOAD_NAMES, help="run this load only (prints its table; writes nothing)")
    args = p.parse_args(argv)
    spec = frontier.bench_spec(frontier.GOAL)
    frontier.register_settings(frontier.planner_profiles(spec))
    tie = frontier.resolution(spec)
    chosen = [s for s in frontier.settings(quick=False) if s.label in LABELS]
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    every = loads(args.duration)
    for load_ in every:
        if args.load and load_.name != args.load:
            continue
        results[load_.name] = [frontier.run(spec, load_, s) for s in chosen]
        print(load_.name, frontier.verdict(results[load_.name], tie), f"({time.perf_counter() - started:.0f}s)")
    if args.load:
        print(frontier.table(results[args.load]))
        return 0
    notes = {load_.name: load_.note for load_ in every}
    parts = [
        "# Autoscaler benchmark on held-out shapes: SLO attainment against GPU-hours\n",
        "Five loads written after the SLO policy, none tuned on; spec, SLO (TTFT p95 <= 1 s, ITL p95 <= 50 ms"
        f" for {frontier.GOAL:.0%} of requests), pools and references as in"
        " [autoscaler-slo.md](autoscaler-slo.md), one setting per baseline family. Command:"
        f" `.venv/bin/python bench/autoscaler/slo_heldout.py` (about {time.perf_counter() - started:.0f} s here).\n",
        "## Summary\n",
        *(f"- **{name}**: {frontier.verdict(rows, tie)}" for name, rows in results.items()),
        "",
    ]
    for name, rows in results.items():
        parts += [f"## {name}: {notes[name]}\n", frontier.table(rows), ""]
    text = "\n".join(parts)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
