"""`xpyd router`: parse the command line, find the workers, serve the OpenAI API on uvloop."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from aiohttp import web

from xpyd_router.app import Background, build_app
from xpyd_router.hashing import DEFAULT_BLOCK_CHARS
from xpyd_router.metrics import RouterMetrics
from xpyd_router.policies import POLICIES, KvAwarePolicy, make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec, parse_worker_arg
from xpyd_router.proxy import ProxyConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpyd router", description="KV-aware OpenAI-compatible router")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prefill", nargs="+", default=[], metavar="URL[@domain]", help="prefill workers")
    p.add_argument("--decode", nargs="+", default=[], metavar="URL[@domain]", help="decode workers")
    p.add_argument("--worker", nargs="+", default=[], metavar="URL[@domain]", help="co-located workers")
    p.add_argument("--deployment", help="DisaggregatedDeployment whose pods to route to (in-cluster)")
    p.add_argument("--namespace", default="default", help="namespace of --deployment")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--policy", choices=sorted(POLICIES), default="kv-aware")
    p.add_argument("--block-chars", type=int, default=DEFAULT_BLOCK_CHARS, help="prefix block size in bytes")
    p.add_argument("--chars-per-token", type=float, default=4.0, help="to size each worker's prefix LRU")
    p.add_argument(
        "--direct-below-chars", type=int, default=2048,
        help="kv-aware: uncached prompts shorter than this skip prefill and go to decode (0: never)",
    )  # fmt: skip
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    p.add_argument("--max-attempts", type=int, default=3, help="tries per request over distinct workers")
    p.add_argument("--max-body-bytes", type=int, default=32 << 20, help="larger bodies get 413")
    p.add_argument("--bootstrap-port", type=int, default=8998, help="SGLang prefill bootstrap port")
    p.add_argument(
        "--upstream-timeout",
        type=float,
        default=600.0,
        help="seconds a worker may stay silent (before its headers or between chunks) before the hop fails",
    )
    p.add_argument("--log-level", default="WARNING")
    return p


def static_workers(args: argparse.Namespace) -> list[WorkerSpec]:
    specs = [parse_worker_arg(u, "prefill") for u in args.prefill]
    specs += [parse_worker_arg(u, "decode") for u in args.decode]
    specs += [parse_worker_arg(u, "worker") for u in args.worker]
    return specs


def validate(args: argparse.Namespace) -> str | None:
    """An error message for inconsistent flags, else None."""
    static = bool(args.prefill or args.decode or args.worker)
    if static == bool(args.deployment):
        return "give either --deployment (in-cluster) or worker URLs (--prefill/--decode or --worker)"
    if args.worker and (args.prefill or args.decode):
        return "--worker (co-located) cannot be mixed with --prefill/--decode"
    if args.prefill and not args.decode:
        return "--prefill needs at least one --decode worker"
    if not 0 < args.port < 65536:
        return f"--port must be 1-65535, got {args.port}"
    if args.block_chars <= 0 or args.block_chars % 8:
        return f"--block-chars must be a positive multiple of 8, got {args.block_chars}"
    if args.max_attempts < 1:
        return "--max-attempts must be at least 1"
    return None


async def serve(args: argparse.Namespace, specs: list[WorkerSpec]) -> None:
    policy = make_policy(args.policy)
    if isinstance(policy, KvAwarePolicy):
        policy.config.direct_below_blocks = max(0, -(-args.direct_below_chars // args.block_chars))
    pool = WorkerPool(policy, args.block_chars, args.chars_per_token)
    pool.set_workers(specs)
    background: list[Background] = []
    if args.deployment:
        from xpyd_router.discovery import watch_deployment

        async def discover(p: WorkerPool) -> None:
            await watch_deployment(args.deployment, args.namespace, p.set_workers)

        background.append(discover)
    metrics = RouterMetrics(args.deployment or "standalone")
    config = ProxyConfig(
        engine=args.engine,
        max_attempts=args.max_attempts,
        bootstrap_port=args.bootstrap_port,
        upstream_timeout=args.upstream_timeout,
    )
    app = build_app(pool, metrics, config, args.scrape_interval, background, args.max_body_bytes)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=30)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port, backlog=1024, reuse_address=True).start()
    gc.collect()
    gc.freeze()  # start-up objects are never garbage: keep them out of every later collection
    gc.set_threshold(50_000, 20, 20)  # fewer young-generation passes per request
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"xpyd router listening on {args.host}:{args.port} ({len(specs)} static workers)", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    problem = validate(args)
    if problem is None:
        try:
            specs = static_workers(args)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"xpyd router: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args, specs))
    return 0
