"""`xpyd simulate`: parse the command line, run the simulation(s), print JSON or a table, write plots."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xpyd_sim import trace as traces
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.kvevents import INDEX_MODES
from xpyd_sim.metrics import Slo
from xpyd_sim.plots import PlotUnavailable, pyplot, write_all
from xpyd_sim.routing import DP_ROUTINGS
from xpyd_sim.runner import COMPARE_KINDS, markdown_table, parse_trace, routers, run_one, variants
from xpyd_sim.scaling import scaler_names
from xpyd_sim.spec import SpecError, load


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpyd simulate", description=__doc__)
    p.add_argument("--spec", required=True, type=Path, help="DisaggregatedDeployment YAML (as for kubectl)")
    p.add_argument(
        "--trace", required=True, help="Mooncake .jsonl, Azure .csv, or synthetic:rate=R,duration=S,prompt=N,..."
    )
    p.add_argument("--router", choices=routers(), help="routing policy (default: the spec's router.policy)")
    p.add_argument("--autoscaler", choices=scaler_names(), help="default: on if the spec enables it")
    p.add_argument("--compare", choices=COMPARE_KINDS, help="run every router / mode / autoscaler and tabulate")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with --compare)")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--seed", type=int, default=0, help="seed of synthetic load and trace overlays")
    p.add_argument("--topology", help="override spec.topology.kind (HGX-B200, GB200-NVL72, H100, HGX-H200)")
    p.add_argument("--hardware", help="override the GPU (H100, H200, B200, GB200)")
    p.add_argument("--prefill", type=int, help="override prefill replicas")
    p.add_argument("--decode", type=int, help="override decode replicas")
    p.add_argument("--workers", type=int, help="override co-located worker replicas")
    p.add_argument(
        "--autoscaler-target",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an autoscaler target as spec.autoscaling.targets names it, e.g. prefillWaitingPerReplica=4",
    )
    p.add_argument("--router-replicas", type=int, help="router replicas, each with its own state (spec's default)")
    p.add_argument(
        "--router-index",
        choices=INDEX_MODES,
        default="own",
        help="what feeds each replica's prefix index: its own routes, the workers' KV events, or both",
    )
    p.add_argument(
        "--dp-routing",
        choices=DP_ROUTINGS,
        default="ranks",
        help="a data-parallel replica: one routing target per rank (the router pins it) or one target"
        " (vLLM's API server picks the rank by load)",
    )
    p.add_argument("--event-delay", type=float, default=0.05, help="seconds a KV event takes to reach the routers")
    p.add_argument("--peer-sync", type=float, default=0.0, help="router replicas share in-flight counts this often (s)")
    p.add_argument("--cache-tokens", type=int, help="cap each worker's prefix cache at this many tokens")
    p.add_argument(
        "--offload-bytes",
        type=_size,
        default=0,
        metavar="BYTES",
        help="host memory per replica for a CPU KV tier (KV offloading), e.g. 200Gi; prefill and co-located"
        " pools (0: none, unless the spec's pools set one)",
    )
    p.add_argument("--offload-decode", action="store_true", help="give decode replicas the CPU KV tier too")
    p.add_argument(
        "--no-tier-pricing",
        dest="tier_pricing",
        action="store_false",
        help="the router counts CPU-held blocks as nothing (default: priced by what a reload saves)",
    )
    p.add_argument(
        "--cpu-tier-weight",
        dest="cpu_block_weight",
        type=float,
        metavar="W",
        help="the router counts a CPU-held block at the fixed share W (0 < W <= 1) of a GPU-held one instead of"
        " pricing it (llm-d's rule: 0.4; the router's --cpu-tier-weight)",
    )
    p.add_argument("--scale", type=int, default=1, help="overlay this many copies of the trace (own prefixes)")
    p.add_argument("--max-requests", type=int, help="replay at most this many requests")
    p.add_argument("--duration", type=float, help="replay arrivals of the first S seconds only")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT objective, seconds (default 2)")
    p.add_argument("--slo-itl", type=float, default=0.1, help="ITL objective, seconds (default 0.1)")
    p.add_argument("--slo-quantile", type=float, default=0.9, help="quantile the objectives apply to (0.9)")
    p.add_argument("--startup", type=float, default=60.0, help="seconds a new replica takes to become Ready")
    p.add_argument("--token-budget", type=int, default=8192, help="max_num_batched_tokens per step")
    p.add_argument("--max-seqs", type=int, default=256, help="max_num_seqs per replica")
    p.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    return p


_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
}


def _size(text: str) -> int:
    """A byte count as Kubernetes quantities write one: 200Gi, 64G, 1000000."""
    value = text.strip()
    unit = value.lstrip("0123456789.")
    number = value[: len(value) - len(unit)]
    try:
        got = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 200Gi, 64G, 1000000)") from None
    if got < 0:
        raise argparse.ArgumentTypeError(f"a byte size must be >= 0, got {text!r}")
    return int(got)


class Progress:
    """A rich progress bar on stderr counting replayed requests over all runs; a no-op when off."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.base = 0
        self._bar: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )  # fmt: skip
            self._task = self._bar.add_task("sim", total=total)

    def update(self, sim: Simulation) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.base + sim.arrived)

    @contextmanager
    def shown(self) -> Iterator[Progress]:
        if self._bar is None:
            yield self
            return
        with self._bar:
            yield self


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = load(args.spec, args.topology, args.hardware)
        sizes = {k: v for k, v in (("prefill", args.prefill), ("decode", args.decode), ("worker", args.workers)) if v}
        unknown = set(sizes) - set(spec.pools)
        if unknown:
            raise SpecError(f"--{'/--'.join(sorted(unknown))}: the spec has no such pool ({spec.mode} mode)")
        spec = spec.with_pools(**sizes)
        base = parse_trace(args.trace, args.seed)
        if args.scale < 1:
            raise traces.TraceError(f"--scale must be >= 1, got {args.scale}")
    except (SpecError, traces.TraceError, OSError) as exc:
        print(f"xpyd simulate: {exc}", file=sys.stderr)
        return 2
    try:
        targets = tuple((k, float(v)) for k, _, v in (t.partition("=") for t in args.autoscaler_target))
    except ValueError:
        print(f"xpyd simulate: --autoscaler-target wants KEY=NUMBER, got {args.autoscaler_target}", file=sys.stderr)
        return 2
    weight = args.cpu_block_weight
    if weight is not None and not 0 < weight <= 1:  # nan fails both
        print(f"xpyd simulate: --cpu-tier-weight must be more than 0 and at most 1, got {weight}", file=sys.stderr)
        return 2
    scaler = args.autoscaler or ("xpyd" if spec.deployment.autoscaling.enabled else "off")
    config = SimConfig(
        router=args.router or spec.deployment.router.policy,
        autoscaler="xpyd" if scaler == "on" else scaler,
        slo=Slo(args.slo_ttft, args.slo_itl, args.slo_quantile),
        max_requests=args.max_requests,
        duration_s=args.duration,
        token_budget=args.token_budget,
        max_seqs=args.max_seqs,
        startup_s=args.startup,
        router_replicas=args.router_replicas,
        router_index=args.router_index,
        event_delay_s=args.event_delay,
        peer_sync_s=args.peer_sync,
        cache_tokens=args.cache_tokens,
        autoscaler_targets=targets,
        dp_routing=args.dp_routing,
        offload_bytes=args.offload_bytes,
        offload_decode=args.offload_decode,
        tier_pricing=args.tier_pricing,
        cpu_block_weight=args.cpu_block_weight,
    )
    if args.plot:
        try:
            pyplot()
        except PlotUnavailable as exc:
            print(f"xpyd simulate: --plot: {exc}", file=sys.stderr)
            return 2
    runs = variants(spec, config, args.compare)
    size = len(base) * args.scale
    total = min(size, args.max_requests or size)
    show = not args.no_progress and (sys.stderr.isatty() or not args.json) and total * len(runs) > 20_000
    rows: list[dict[str, Any]] = []
    try:
        with Progress(show, total * len(runs)).shown() as bar:
            for v in runs:
                # overlaid copies are generated as the replay goes, so memory follows what is in flight
                replay = traces.scaled(base, args.scale, args.seed) if args.scale > 1 else base
                rows.append(run_one(v, replay, bar.update))
                bar.base += total
    except ValueError as exc:
        print(f"xpyd simulate: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        for path in write_all(rows, args.plot, f"{spec.name} on {spec.topology.name}"):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows if args.compare else rows[0]))
    elif args.compare:
        print(markdown_table(rows))
    else:
        _print_summary(rows[0])
    return 0


def _print_summary(row: dict[str, Any]) -> None:
    skip = {"replicas", "replicas_columns"}
    width = max(len(k) for k in row)
    for key, value in row.items():
        if key == "replica_fit":  # one line per pool, as the operator's condition words it
            for role, summary in value.items():
                print(f"{key:<{width}}  {role}: {summary}")
        elif key not in skip:
            print(f"{key:<{width}}  {value}")


__all__ = ["main"]
