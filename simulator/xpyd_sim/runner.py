"""Runs one or several simulations of a spec over a trace: the shared path of the CLI and the bench."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xpyd_api.models import PoolAutoscaling, PoolSpec
from xpyd_operator.autoscaling.policy import AUTOSCALERS
from xpyd_router.policy.registry import POLICIES
from xpyd_sim import trace as traces
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.report import build
from xpyd_sim.spec import SimSpec

COMPARE_KINDS = ("routers", "modes", "autoscalers", "all")


def routers() -> list[str]:
    """The routing policies a comparison runs: the router's registry (benchmarks add their peers)."""
    return list(POLICIES)


def autoscalers() -> list[str]:
    """The autoscaling policies a comparison runs, from the operator's registry (benchmarks add their
    peers): "off" first as the baseline, xpyd's own last."""
    return sorted(AUTOSCALERS, key=lambda name: (name != "off", name == "xpyd", name))


def parse_trace(arg: str, seed: int = 0) -> list[traces.TraceRequest]:
    """A trace file, or `synthetic:rate=R,duration=S,prompt=N,output=N,shared=K` (Poisson)."""
    if arg.startswith("synthetic"):
        opts: dict[str, float] = {}
        for item in filter(None, arg.partition(":")[2].split(",")):
            key, _, value = item.partition("=")
            try:
                opts[key.strip()] = float(value)
            except ValueError:
                raise traces.TraceError(f"synthetic option {item!r} is not key=number") from None
        known = {"rate", "duration", "prompt", "output", "shared", "shared_tokens"}
        if set(opts) - known:
            raise traces.TraceError(f"unknown synthetic options {sorted(set(opts) - known)}; known: {sorted(known)}")
        cfg = traces.Synthetic(
            rate=opts.get("rate", 5.0),
            duration=opts.get("duration", 600.0),
            prompt_mean=int(opts.get("prompt", 2048)),
            output_mean=int(opts.get("output", 256)),
            shared_prefixes=int(opts.get("shared", 0)),
            shared_tokens=int(opts.get("shared_tokens", 1024)),
            seed=seed,
        )
        return list(traces.synthetic(cfg))
    return list(traces.load(Path(arg)))


def _bounds(pool: PoolSpec, start: int) -> tuple[int, int]:
    """A pool's autoscaling bounds; a pool without them holds its start size."""
    return (pool.autoscaling.min_replicas, pool.autoscaling.max_replicas) if pool.autoscaling else (start, start)


def colocated(spec: SimSpec) -> SimSpec:
    """The same GPUs as one co-located pool (chunked prefill): P + D replicas of the decode shape."""
    dep = spec.deployment
    if dep.mode == "Colocated" or dep.prefill is None or dep.decode is None:
        return spec
    p, d = spec.pools["prefill"], spec.pools["decode"]
    (p_low, p_high), (d_low, d_high) = _bounds(dep.prefill, p.replicas), _bounds(dep.decode, d.replicas)
    scaled = dep.prefill.autoscaling is not None or dep.decode.autoscaling is not None
    worker = dep.decode.model_copy(
        update={
            "replicas": p.replicas + d.replicas,
            "tensor_parallel_size": d.tp,
            "autoscaling": PoolAutoscaling(min_replicas=p_low + d_low, max_replicas=p_high + d_high)
            if scaled
            else None,
        }
    )
    return spec.with_deployment(
        dep.model_copy(update={"mode": "Colocated", "prefill": None, "decode": None, "worker": worker})
    )


@dataclass(frozen=True)
class Variant:
    """One row of a comparison: a label, the spec and the run's knobs."""

    label: str
    spec: SimSpec
    config: SimConfig


def variants(spec: SimSpec, base: SimConfig, kind: str | None) -> list[Variant]:
    """The runs a `--compare` kind asks for (just the base run when kind is None)."""
    if kind is None:
        return [Variant(f"{base.router}/{base.autoscaler}/{spec.mode}", spec, base)]
    if kind not in COMPARE_KINDS:
        raise ValueError(f"unknown comparison {kind!r}; choose one of {', '.join(COMPARE_KINDS)}")
    out: list[Variant] = []
    if kind in ("routers", "all"):
        out += [Variant(f"router={r}", spec, replace(base, router=r)) for r in routers()]
    if kind in ("modes", "all"):
        out += [
            Variant("disaggregated", spec, base),
            Variant("colocated", colocated(spec), base),
        ]
    if kind in ("autoscalers", "all"):
        out += [Variant(f"autoscaler={a}", spec, replace(base, autoscaler=a)) for a in autoscalers()]
    return out


def run_one(
    variant: Variant,
    load: Iterable[traces.TraceRequest],
    progress: Callable[[Simulation], None] | None = None,
) -> dict[str, Any]:
    sim = Simulation(variant.spec, load, variant.config)
    sim.progress = progress
    start, cpu = time.perf_counter(), time.process_time()
    sim.run()
    result = build(sim, time.perf_counter() - start, time.process_time() - cpu)
    result["label"] = variant.label
    return result


TABLE_COLUMNS = (
    ("label", "run", "{}"),
    ("xpyd", "xPyD", "{}"),
    ("slo_attainment", "SLO att.", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.3f}"),
    ("itl_p99_s", "ITL p99 ms", "{:.1f}", 1000.0),
    ("e2e_p99_s", "e2e p99 s", "{:.2f}"),
    ("prefix_hit_ratio", "prefix hit", "{:.1%}"),
    ("imbalance", "imbalance", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.1f}"),
    ("replicas_max", "max replicas", "{}"),
)


def _cell(row: dict[str, Any], col: tuple[Any, ...]) -> str:
    value = row.get(col[0])
    if value is None:
        return "-"
    if col[0] == "replicas_max":
        return "/".join(str(v) for v in value.values())
    if len(col) > 3:
        value = value * col[3]
    return str(col[2].format(value))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a Markdown table (also what the terminal shows)."""
    head = "| " + " | ".join(c[1] for c in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    body = ["| " + " | ".join(_cell(r, c) for c in TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])
