"""Dispatches `xpyd <command>` to the component that owns it, importing only that component."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

from xpyd_cli import errors

# command -> (module with `main(argv: list[str]) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("xpyd_operator.cli", "run the Kopf operator (in-cluster or from a kubeconfig)"),
    "router": ("xpyd_router.cli", "run the KV-aware OpenAI-compatible router"),
    "emulate": ("xpyd_emulator.cli", "run the vLLM worker emulator from a vLLM command line"),
    "plan": ("xpyd_perf.cli", "print the disaggregation break-even table and an xPyD suggestion"),
    "render": ("xpyd_operator.render", "print every object the operator would create for a DisaggregatedDeployment"),
    "simulate": ("xpyd_sim.cli", "replay a trace through the router and autoscaler policies"),
    "load": ("xpyd_load.cli", "replay a trace against a live router with a progress bar"),
    "cluster": ("xpyd_cluster.cli", "bring the local test cluster up or down"),
    "kubelet": ("xpyd_cluster.kubelet", "run the process kubelet of the local cluster"),
}


def _entry(command: str) -> Callable[[list[str]], int]:
    """The command's `main`, imported only when it runs (`xpyd router` never loads kopf); the imports are
    written out so the import contracts see every edge."""
    if command == "operator":
        from xpyd_operator.cli import main as operator_main

        return operator_main
    if command == "router":
        from xpyd_router.cli import main as router_main

        return router_main
    if command == "emulate":
        from xpyd_emulator.cli import main as emulate_main

        return emulate_main
    if command == "plan":
        from xpyd_cli.httpget import get
        from xpyd_cli.planspec import preflight
        from xpyd_perf.cli import main as plan_main

        # xpyd_perf does no network I/O and reads no deployment spec: --measured URLs and --spec read here
        return functools.partial(plan_main, fetch=get, preflight=preflight)
    if command == "render":
        from xpyd_operator.render import main as render_main

        return render_main
    if command == "simulate":
        from xpyd_sim.cli import main as simulate_main

        return simulate_main
    if command == "load":
        from xpyd_load.cli import main as load_main

        return load_main
    if command == "cluster":
        from xpyd_cluster.cli import main as cluster_main

        return cluster_main
    from xpyd_cluster.kubelet import main as kubelet_main

    return kubelet_main


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
        result = _entry(command)(rest)
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
