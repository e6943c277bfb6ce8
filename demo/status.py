"""Prints the autoscaler's last decision per pool of a DisaggregatedDeployment read from stdin (kubectl -o json)."""

from __future__ import annotations

import json
import sys


def main() -> int:
    auto = json.load(sys.stdin).get("status", {}).get("autoscaler") or {}
    for role in ("prefill", "decode", "worker"):
        pool = auto.get(role)
        if isinstance(pool, dict):
            change = f"{pool.get('actual')} -> {pool.get('desired')}"
            print(f"  {role:8} {change:8} {pool.get('reason')}: {pool.get('message')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
