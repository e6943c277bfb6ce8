"""Plots replicas per pool and queue length over the demo run, read back from Prometheus."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from promql import READY, query_range  # type: ignore[import-not-found]

QUERIES = {
    "ready replicas": READY,
    "desired replicas": 'max by (role) (xpyd_autoscaler_desired_replicas{{deployment="{d}"}})',
    "queued requests": 'sum by (xpyd_role) (vllm:num_requests_waiting{{xpyd_deployment="{d}"}})',
    "running requests": 'sum by (xpyd_role) (vllm:num_requests_running{{xpyd_deployment="{d}"}})',
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--deployment", required=True)
    p.add_argument("--since", type=float, required=True, help="unix time the run started")
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args()
    end = time.time()
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for title, expr in QUERIES.items():
        ax = axes[0] if "replicas" in title else axes[1]
        for series in query_range(ns.prometheus, expr.format(d=ns.deployment), ns.since, end, 2.0):
            who = series["metric"].get("xpyd_role") or series["metric"].get("role", "?")
            xs = [float(t) - ns.since for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            style = "--" if title.startswith("desired") else "-"
            ax.step(xs, ys, style, where="post", label=f"{who} {title}")
    axes[0].set_ylabel("replicas")
    axes[1].set_ylabel("requests")
    axes[1].set_xlabel("seconds since the load started")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{ns.deployment}: the autoscaler follows the load")
    fig.tight_layout()
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(ns.out, dpi=110)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
