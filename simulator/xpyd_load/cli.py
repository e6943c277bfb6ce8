"""`xpyd load`: replay a trace against a router or worker with a progress bar, bounded in count and time."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from xpyd_sim import trace

from .runner import LoadConfig, Outcome, Unreachable, check_url, preflight, run


def _requests(ns: argparse.Namespace) -> Iterator[trace.TraceRequest]:
    if ns.trace:
        requests = trace.load(Path(ns.trace))
        return (r for i, r in enumerate(requests) if i >= ns.skip)
    return trace.synthetic(
        trace.Synthetic(
            rate=ns.rate,
            duration=ns.duration * ns.speedup,
            prompt_mean=ns.prompt_tokens,
            output_mean=ns.output_tokens,
            shared_prefixes=ns.shared_prefixes,
            seed=ns.seed,
        )
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpyd load", description=__doc__)
    p.add_argument(
        "--url",
        required=True,
        action="append",
        help="base URL of the router (or a worker), e.g. http://127.1.0.5:8000; repeat it for router replicas, "
        "which then get the requests in turn (as a Service spreads them)",
    )
    p.add_argument("--model", required=True, help="served model name")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", help="Mooncake .jsonl or Azure .csv trace")
    src.add_argument("--rate", type=float, default=4.0, help="synthetic Poisson arrivals per second")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="synthetic mean prompt length")
    p.add_argument("--output-tokens", type=int, default=128, help="synthetic mean answer length")
    p.add_argument("--shared-prefixes", type=int, default=0, help="synthetic: number of shared system prompts")
    p.add_argument("--skip", type=int, default=0, help="skip the first N trace requests")
    p.add_argument("--speedup", type=float, default=1.0, help="replay arrivals this many times faster")
    p.add_argument("--max-requests", type=int, default=200)
    p.add_argument("--duration", type=float, default=120.0, help="stop sending after this many seconds")
    p.add_argument("--max-in-flight", type=int, default=64)
    p.add_argument("--prompt-scale", type=float, default=1.0, help="multiply every prompt length by this")
    p.add_argument("--max-output-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT objective (s) for slo_attainment")
    p.add_argument("--slo-itl", type=float, default=0.1, help="mean inter-token time objective (s)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("XPYD_API_KEY", ""),
        help="bearer token for a router started with an API key (env XPYD_API_KEY)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON summary and no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.speedup <= 0 or ns.max_requests <= 0 or ns.duration <= 0 or ns.max_in_flight <= 0:
        print("xpyd load: --speedup, --max-requests, --duration and --max-in-flight must be positive", file=sys.stderr)
        return 2
    bad_url = next(filter(None, map(check_url, ns.url)), None)
    if bad_url:
        print(f"xpyd load: {bad_url}", file=sys.stderr)
        return 2
    try:
        requests = _requests(ns)
        first = next(requests, None)
    except (trace.TraceError, OSError) as exc:
        print(f"xpyd load: {exc}", file=sys.stderr)
        return 2
    if first is None:
        print(
            "xpyd load: no requests to send (the trace is empty after --skip, or --rate x --duration is too small)",
            file=sys.stderr,
        )
        return 2
    cfg = LoadConfig(
        url=ns.url[0],
        spread=tuple(ns.url[1:]),
        slo_ttft_s=ns.slo_ttft,
        slo_itl_s=ns.slo_itl,
        model=ns.model,
        speedup=ns.speedup,
        max_requests=ns.max_requests,
        duration_s=ns.duration,
        max_in_flight=ns.max_in_flight,
        prompt_scale=ns.prompt_scale,
        max_output_tokens=ns.max_output_tokens,
        api_key=ns.api_key,
    )
    try:
        asyncio.run(preflight(cfg))
    except Unreachable as exc:
        print(f"xpyd load: {exc}", file=sys.stderr)
        return 2
    progress = Progress(
        TextColumn("load"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=ns.json,
        transient=False,
    )
    errors = 0

    with progress:
        task = progress.add_task("load", total=cfg.max_requests, info="")

        def done(outcome: Outcome) -> None:
            nonlocal errors
            errors += bool(outcome.error or outcome.status != 200)
            ttft = f"ttft {outcome.ttft_s * 1000:.0f} ms" if outcome.ttft_s is not None else "no tokens"
            progress.update(task, advance=1, info=f"{ttft}, errors {errors}")

        result = asyncio.run(run(cfg, itertools.chain([first], requests), done))
    summary = result.summary()
    print(json.dumps(summary) if ns.json else "  ".join(f"{k}={v}" for k, v in summary.items()))
    return 0 if summary["ok"] > 0 else 1
