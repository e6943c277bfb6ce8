"""Operator benchmark against the cluster named by KUBECONFIG: apply latency, 100-object convergence,
write calls at steady state (from apiserver_request_total) and operator RSS.

    .venv/bin/python bench/operator/bench_operator.py [--objects 100] [--latency-objects 20] [--resync 15]

Pools and routers are created with replicas 0, so the numbers measure the operator (children and
status), not how fast a kubelet starts processes. Results go to bench/results/operator.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lightkube import Client, KubeConfig  # noqa: E402
from lightkube.resources.apps_v1 import Deployment, StatefulSet  # noqa: E402
from lightkube.resources.core_v1 import Service, ServiceAccount  # noqa: E402
from lightkube.resources.policy_v1 import PodDisruptionBudget  # noqa: E402
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding  # noqa: E402
from testkit.kube_operator import DD, Kube, OperatorProcess, dd_manifest  # noqa: E402

KINDS: list[Any] = [StatefulSet, Deployment, Service, ServiceAccount, PodDisruptionBudget, Role, RoleBinding]
CHILDREN_PER_OBJECT = 11
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "CREATE", "UPDATE"}
OPERATOR_RESOURCES = {
    "disaggregateddeployments", "statefulsets", "deployments", "services", "poddisruptionbudgets",
    "serviceaccounts", "roles", "rolebindings", "events",
}  # fmt: skip


class Seen:
    """First-seen times of children and of each object's first written status, from watches."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.children: dict[str, set[str]] = {}
        self.done_at: dict[str, float] = {}
        self.status_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def start(self) -> None:
        for res in [*KINDS, DD]:
            threading.Thread(target=self._watch, args=(res,), daemon=True).start()

    def _watch(self, res: Any) -> None:
        client = Client(config=KubeConfig.from_env())
        for _, obj in client.watch(res, namespace=self.namespace):
            now = time.monotonic()
            meta = obj.metadata
            with self.lock:
                if res is DD:
                    status = obj.to_dict().get("status") or {}
                    if status.get("observedGeneration") == meta.generation and meta.name not in self.status_at:
                        self.status_at[meta.name] = now
                    continue
                owner = (meta.labels or {}).get("xpyd.io/deployment")
                if owner is None:
                    continue
                kids = self.children.setdefault(owner, set())
                kids.add(f"{res.__name__}/{meta.name}")
                if len(kids) == CHILDREN_PER_OBJECT and owner not in self.done_at:
                    self.done_at[owner] = now

    def wait(self, names: list[str], timeout: float, status: bool = False) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                table = self.status_at if status else self.done_at
                if all(n in table for n in names):
                    return True
            time.sleep(0.01)
        return False


def apiserver_writes() -> Counter[str]:
    raw = subprocess.run(["kubectl", "get", "--raw", "/metrics"], capture_output=True, text=True, check=True).stdout
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
        verb, resource = labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"')
        if verb in WRITE_VERBS and resource in OPERATOR_RESOURCES:
            sub = labels.get("subresource", '""').strip('"')
            out[f"{verb} {resource}{'/' + sub if sub else ''}"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def operator_writes(port: int) -> Counter[str]:
    """The operator's own count of its write calls (xpyd_operator_api_writes_total)."""
    import httpx

    out: Counter[str] = Counter()
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith("xpyd_operator_api_writes_total{"):
            labels = line[line.index("{") + 1 : line.index("}")].replace('"', "")
            out[labels] += int(float(line.rsplit(" ", 1)[1]))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spec_zero() -> dict[str, Any]:
    return {
        "topology": "Any",
        "prefill": {"replicas": 0, "gpusPerReplica": 1},
        "decode": {"replicas": 0, "gpusPerReplica": 1},
        "router": {"replicas": 0},
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    kube = Kube()
    kube.install_crd()
    ns = kube.create_namespace("xpyd-bench")
    log = Path(tempfile.mkdtemp()) / "operator.log"
    port = free_port()
    metrics = ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"]
    proc = OperatorProcess([ns], log, resync_seconds=args.resync, extra_args=metrics).start()
    seen = Seen(ns)
    seen.start()
    result: dict[str, Any] = {"namespace": ns, "resync_seconds": args.resync}
    try:
        time.sleep(3)  # operator startup and watch establishment
        latencies = []
        for i in range(args.latency_objects):
            name = f"lat-{i}"
            t0 = time.monotonic()
            kube.apply_dd(dd_manifest(name, ns, **spec_zero()))
            if not seen.wait([name], 30):
                raise RuntimeError(f"{name}: children not created within 30 s\n{proc.log_tail()}")
            latencies.append(seen.done_at[name] - t0)
        result["apply_to_children_s"] = {
            "n": len(latencies),
            "p50": statistics.median(latencies),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies),
        }
        names = [f"bulk-{i}" for i in range(args.objects)]
        t0 = time.monotonic()
        for name in names:
            kube.apply_dd(dd_manifest(name, ns, **spec_zero()))
        applied = time.monotonic() - t0
        ok = seen.wait(names, args.timeout) and seen.wait(names, args.timeout, status=True)
        end = max(max(seen.done_at.get(n, 0) for n in names), max(seen.status_at.get(n, 0) for n in names))
        result["bulk"] = {"objects": args.objects, "apply_calls_s": applied, "converged": ok, "converge_s": end - t0}
        time.sleep(args.resync + 2)  # let the first resync after convergence pass
        before, own_before = apiserver_writes(), operator_writes(port)
        time.sleep(args.resync * args.periods)
        after, own_after = apiserver_writes(), operator_writes(port)
        delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
        own = {k: own_after[k] - own_before.get(k, 0) for k in own_after if own_after[k] - own_before.get(k, 0)}
        result["steady_state"] = {
            "periods": args.periods,
            "apiserver_write_calls_all_clients": sum(delta.values()),
            "apiserver_by_verb_resource": delta,
            "operator_write_calls": sum(own.values()),
            "operator_write_calls_per_period": sum(own.values()) / args.periods,
            "operator_by_verb_kind": own,
            "operator_writes_total": sum(own_after.values()),
        }
        result["operator_rss_mb"] = rss_mb(proc.pid)
        result["machine"] = {"cpus": os.cpu_count(), "loadavg_1m_at_end": os.getloadavg()[0]}
        result["objects_total"] = args.objects + args.latency_objects
    finally:
        proc.stop()
        kube.delete_namespace(ns)
        kube.close()
    return result


def report(result: dict[str, Any]) -> str:
    lat, bulk, steady = result["apply_to_children_s"], result["bulk"], result["steady_state"]
    return "\n".join(
        [
            "# Operator benchmark",
            "",
            "`.venv/bin/python bench/operator/bench_operator.py` against the local cluster (kwok nodes, real",
            "kube-apiserver/controller-manager/scheduler). Pools and routers have replicas 0: the figures are",
            "the operator's (children applied, status written), not process start-up. Machine: "
            f"{result['machine']['cpus']} CPUs shared with the cluster and other tests, load average "
            f"{result['machine']['loadavg_1m_at_end']:.1f} at the end of the run.",
            "",
            "| measure | goal | result |",
            "|---|---|---|",
            f"| apply -> all 11 children, p50 over {lat['n']} objects | <= 1 s | {lat['p50']:.3f} s |",
            f"| apply -> all 11 children, p99 | | {lat['p99']:.3f} s (max {lat['max']:.3f} s) |",
            f"| {bulk['objects']} objects applied at once: children + status | <= 60 s | "
            f"{bulk['converge_s']:.1f} s (converged: {bulk['converged']}) |",
            f"| operator write calls at steady state per resync period ({result['resync_seconds']:.0f} s) | 0 | "
            f"{steady['operator_write_calls_per_period']:.1f} |",
            f"| operator RSS with {result['objects_total']} objects | <= 200 MB | {result['operator_rss_mb']:.0f} MB |",
            "",
            f"Steady state, over {steady['periods']} resync periods after convergence: the API server's",
            "`apiserver_request_total` counted "
            f"{steady['apiserver_write_calls_all_clients']} write calls on the kinds the operator writes, from all",
            f"clients (`{json.dumps(steady['apiserver_by_verb_resource'])}`); the operator's own",
            f"`xpyd_operator_api_writes_total` moved by {steady['operator_write_calls']} "
            f"(`{json.dumps(steady['operator_by_verb_kind'])}`). It made {steady['operator_writes_total']} writes",
            "in the whole run. `apiserver_request_total` has no client label: the other writes in that window",
            "are the controllers, kubelet and other tests sharing the cluster.",
            "",
        ]
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=100)
    p.add_argument("--latency-objects", type=int, default=20)
    p.add_argument("--resync", type=float, default=15.0, help="operator resync (timer) period, seconds")
    p.add_argument("--periods", type=int, default=2, help="steady-state periods to count writes over")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args()
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "operator.json").write_text(json.dumps(result, indent=2) + "\n")
    text = report(result)
    (args.out / "operator.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
