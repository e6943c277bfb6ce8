"""`xpyd emulate [--gpu B200] [--speedup X] [--zero-delay] [limits] -- <vLLM or SGLang command line>`.

Bad input (flags, env, the engine command line, a --config file, a port that cannot be bound)
ends the process with one line on stderr naming the problem and the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from xpyd_emulator.cmdline import EmulatorConfig, parse_engine_command
from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.member import run_rank
from xpyd_emulator.options import KNOBS
from xpyd_emulator.server import serve
from xpyd_perf import UnknownGpuError, resolve_gpu

EXIT_USAGE = 2
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"{message} (see 'xpyd emulate --help')")


def _parser() -> argparse.ArgumentParser:
    env_names = ", ".join(k.env for k in KNOBS)
    p = _Parser(
        prog="xpyd emulate",
        description="Serve vLLM's API, metrics and KV-transfer protocol with modelled timings.",
        epilog="env: XPYD_BIND_HOST, XPYD_GPU, XPYD_SPEEDUP, XPYD_ZERO_DELAY, XPYD_NODE_NAME, "
        "XPYD_NVLINK_DOMAIN, XPYD_HOSTS_FILE (resolves a multi-node replica's leader), "
        "XPYD_KV_LEASE_SECONDS (else VLLM_NIXL_ABORT_REQUEST_TIMEOUT, default 30), "
        f"VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT, {env_names}",
    )
    p.add_argument("--gpu", default=None, help="B200 | GB200 | H100 | H200 (default: $XPYD_GPU or B200)")
    p.add_argument("--speedup", type=float, default=None, help="run modelled time X times faster")
    p.add_argument("--zero-delay", action="store_true", help="answer at once (to measure router overhead)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LEVELS)
    for knob in KNOBS:
        p.add_argument(knob.flag, dest=knob.field, default=None, help=f"{knob.help} [env {knob.env}]",
                       action="append" if knob.repeat else "store")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the vLLM or SGLang command line")
    return p


def _fail(message: str) -> int:
    print(f"xpyd emulate: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _joined(value: str | list[str] | None) -> str | None:
    """A repeated flag's values as one comma-separated list, as its env variable takes them."""
    return ",".join(value) if isinstance(value, list) else value


def configure(argv: Sequence[str], env: dict[str, str]) -> tuple[EmulatorConfig, str]:
    """The configuration and log level for `xpyd emulate` arguments; raises CommandLineError."""
    args = _parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    flags = {knob.field: _joined(getattr(args, knob.field)) for knob in KNOBS}
    cfg = parse_engine_command(
        command, env, gpu=args.gpu, speedup=args.speedup, zero_delay=args.zero_delay or None, flags=flags
    )
    try:
        resolve_gpu(cfg.gpu)
    except UnknownGpuError as exc:
        raise CommandLineError(f"{exc} (set --gpu or XPYD_GPU)") from None
    return cfg, args.log_level


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, level = configure(sys.argv[1:] if argv is None else argv, dict(os.environ))
    except CommandLineError as exc:
        return _fail(str(exc))
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    try:
        if not cfg.group.api:  # a non-API rank of a multi-node replica: join the leader, exit when it goes
            return asyncio.run(run_rank(cfg))
        asyncio.run(serve(cfg))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        group = f"/group port {cfg.group.leader_port}" if cfg.group.multi_node else ""
        return _fail(
            f"cannot serve on {cfg.host}:{cfg.port} (or its side-channel/bootstrap/KV-events{group} port): {reason}; "
            "free the port or pick another (--port, VLLM_NIXL_SIDE_CHANNEL_PORT, XPYD_BIND_HOST)"
        )
    return 0
