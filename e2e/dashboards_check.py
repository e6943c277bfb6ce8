"""Runs every dashboard panel's PromQL against a real Prometheus: none may error or come back empty.

Used by the autoscaler e2e test (after its load ran through the router and both pools scaled)
and by `python -m e2e.dashboards_check [--with FEATURE] ns/name ...` after `make demo`. A query whose
series exist only with a feature (xpyd_dashboards.FEATURES: `slo`, a deployment stating spec.slo;
`scale-to-zero`, one with a pool at minReplicas 0) is asked for data only when `--with` names it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Collection

import httpx

from xpyd_dashboards import FEATURES, all_queries, applicable, substitute

STEP_SECONDS = 15


def run_range(client: httpx.Client, expr: str, window: float) -> list[dict[str, object]]:
    """The query over the window; raises AssertionError naming Prometheus's error."""
    end = time.time()
    params = {"query": expr, "start": f"{end - window:.3f}", "end": f"{end:.3f}", "step": f"{STEP_SECONDS}s"}
    response = client.get("/api/v1/query_range", params=params)
    body = response.json()
    assert response.status_code == 200, f"HTTP {response.status_code}: {body.get('error')} in {expr}"
    assert body["status"] == "success", f"{body.get('errorType')}: {body.get('error')} in {expr}"
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def panel_failures(
    prometheus: str, deployments: list[tuple[str, str]], window: float = 900.0, features: Collection[str] = (),
    only: str | None = None,
) -> list[str]:  # fmt: skip
    """One line per panel query that errors or returns nothing for a deployment, over the last `window` s;
    queries that need a feature outside `features` are left out, and with `only` every query but that
    feature's (a test of the feature alone)."""
    failures: list[str] = []
    queries = applicable(all_queries(), {*features, only} if only else features)
    with httpx.Client(base_url=prometheus.rstrip("/"), timeout=30) as client:
        for query in queries if only is None else [q for q in queries if q.needs == only]:
            for namespace, name in deployments:
                expr = substitute(query.expr, namespace=namespace, deployment=name, rate_interval="1m")
                try:
                    if not run_range(client, expr, window):
                        failures.append(f"{query.title} / {query.legend}: no data for {namespace}/{name}: {expr}")
                except AssertionError as exc:
                    failures.append(f"{query.title} / {query.legend}: {exc}")
    return failures


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m e2e.dashboards_check", description=summary)
    parser.add_argument("deployments", nargs="+", metavar="NAMESPACE/NAME")
    parser.add_argument(
        "--with", dest="features", action="append", choices=FEATURES, default=[],
        help="the deployments have this feature: its queries must have data too (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    prometheus = os.environ.get("PROMETHEUS_URL", "http://127.0.0.1:9090")
    deployments = [(a.split("/", 1)[0], a.split("/", 1)[1]) for a in args.deployments if "/" in a]
    if len(deployments) != len(args.deployments):
        parser.error("each deployment is NAMESPACE/NAME (PROMETHEUS_URL, default local)")
    failures = panel_failures(prometheus, deployments, features=args.features)
    for line in failures:
        print("EMPTY", line)
    total = len(applicable(all_queries(), args.features)) * len(deployments)
    print(f"dashboard check: {total - len(failures)}/{total} panel queries have data")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
