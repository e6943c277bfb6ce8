"""Dispatches `xpyd <command>` to the component that owns it, importing only that component."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from xpyd_cli import errors

# command -> (module with `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("xpyd_operator.cli", "run the Kopf operator (in-cluster or from a kubeconfig)"),
    "router": ("xpyd_router.cli", "run the KV-aware OpenAI-compatible router"),
    "emulate": ("xpyd_emulator.cli", "run the vLLM worker emulator from a vLLM command line"),
    "plan": ("xpyd_perf.cli", "print the disaggregation break-even table and an xPyD suggestion"),
    "simulate": ("xpyd_sim.cli", "replay a trace through the router and autoscaler policies"),
    "load": ("xpyd_load.cli", "replay a trace against a live router with a progress bar"),
    "cluster": ("xpyd_cluster.cli", "bring the local test cluster up or down"),
    "kubelet": ("xpyd_cluster.kubelet", "run the process kubelet of the local cluster"),
}


def usage() -> str:
    lines = ["usage: xpyd <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(
            f"xpyd: unknown command {command!r}; commands: {', '.join(COMMANDS)} (see 'xpyd --help')", file=sys.stderr
        )
        return 2
    errors.one_line_argparse_errors()
    try:
        module = importlib.import_module(COMMANDS[command][0])
        result: int = module.main(rest)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if errors.debug():
            raise
        print(f"xpyd {command}: {errors.describe(exc)}", file=sys.stderr)
        return errors.EXIT_USAGE
    return result


if __name__ == "__main__":
    sys.exit(main())
