"""Fails the demo unless each pool really grew under its load and shrank back after (from Prometheus)."""

from __future__ import annotations

import argparse
import sys
import time

from promql import READY, by_role, query_range  # type: ignore[import-not-found]


def verdict(ready: dict[str, list[float]], start_size: dict[str, int]) -> list[str]:
    """Problems with a run's ready-replica series per role: pure, so it is unit-tested."""
    problems = []
    for role, first in start_size.items():
        values = ready.get(role, [])
        if not values:
            problems.append(f"{role}: no ready-replica samples in Prometheus")
            continue
        if max(values) <= first:
            problems.append(f"{role}: never grew above {first} ready replicas under load (peak {max(values):.0f})")
        if values[-1] > first:
            problems.append(f"{role}: still {values[-1]:.0f} ready replicas after the load stopped (want {first})")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--deployment", required=True)
    p.add_argument("--since", type=float, required=True, help="unix time the load started")
    p.add_argument("--prefill", type=int, default=1, help="prefill replicas before the load")
    p.add_argument("--decode", type=int, default=1, help="decode replicas before the load")
    ns = p.parse_args()
    series = query_range(ns.prometheus, READY.format(d=ns.deployment), ns.since, time.time(), 2.0)
    ready = by_role(series)
    problems = verdict(ready, {"prefill": ns.prefill, "decode": ns.decode})
    for role, values in sorted(ready.items()):
        print(f"  {role:8} ready replicas: start {values[0]:.0f}, peak {max(values):.0f}, end {values[-1]:.0f}")
    for problem in problems:
        print(f"demo check failed: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
