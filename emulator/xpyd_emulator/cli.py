"""`xpyd emulate [--gpu B200] [--speedup X] [--zero-delay] -- <vLLM command line>`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from xpyd_emulator.cmdline import CommandLineError, parse_engine_command
from xpyd_emulator.server import serve
from xpyd_perf import UnknownGpuError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xpyd emulate",
        description="Serve vLLM's API, metrics and KV-transfer protocol with modelled timings.",
        epilog="env: XPYD_BIND_HOST, XPYD_GPU, XPYD_SPEEDUP, XPYD_ZERO_DELAY, XPYD_NODE_NAME, "
        "XPYD_NVLINK_DOMAIN, XPYD_KV_LEASE_SECONDS, VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT",
    )
    p.add_argument("--gpu", default=None, help="B200 | GB200 | H100 | H200 (default: $XPYD_GPU or B200)")
    p.add_argument("--speedup", type=float, default=None, help="run modelled time X times faster")
    p.add_argument("--zero-delay", action="store_true", help="answer at once (to measure router overhead)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the vLLM or SGLang command line")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = parse_engine_command(
            command, os.environ, gpu=args.gpu, speedup=args.speedup, zero_delay=args.zero_delay or None
        )
        from xpyd_perf import resolve_gpu

        resolve_gpu(cfg.gpu)
    except (CommandLineError, UnknownGpuError) as exc:
        print(f"xpyd emulate: error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:
        print(f"xpyd emulate: error: cannot serve on {cfg.host}:{cfg.port}: {exc}", file=sys.stderr)
        return 1
    return 0
