"""`xpyd cluster up|down|nodes|env|stop|start`: the local test cluster, idempotent in both directions."""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import yaml

from . import control_plane, daemons, lws, nodes, pki, prometheus
from .paths import REPO, Layout, default_layout


class ClusterError(RuntimeError):
    """The local cluster cannot do what was asked; the message says what to do."""


def _start_lws(layout: Layout) -> None:
    lws.start(layout)
    lws.wait_ready(layout, functools.partial(kubectl, layout))


# Components a fault test may stop and start again (their state survives in the layout's folders).
RESTARTABLE: dict[str, Callable[[Layout], None]] = {
    "etcd": control_plane.start_etcd,
    "kube-apiserver": control_plane.start_apiserver,
    "lws": _start_lws,
    "prometheus": prometheus.start,
}


def kubectl(layout: Layout, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(layout.bin / "kubectl"), f"--kubeconfig={layout.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _step(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def _nodes_ready(layout: Layout, expected: int) -> bool:
    items = json.loads(kubectl(layout, "get", "nodes", "-o", "json"))["items"]
    ready = [
        n
        for n in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    ]
    return len(ready) >= expected


def up(layout: Layout, with_prometheus: bool = True) -> None:
    started = time.monotonic()
    _step(f"building cluster binaries (cached in {layout.bin})")
    built = subprocess.run(["bash", str(REPO / "cluster" / "build-tools.sh")], check=False, stdout=subprocess.DEVNULL)
    if built.returncode != 0:
        raise ClusterError("building the cluster's binaries failed (the lines above name the module and the fix)")
    for d in (layout.state, layout.logs, layout.run, layout.pods):
        d.mkdir(parents=True, exist_ok=True)
    pki.ensure(layout)
    _step("starting etcd and kube-apiserver")
    control_plane.start_etcd(layout)
    control_plane.start_apiserver(layout)
    _step("starting controller manager, scheduler and kwok")
    control_plane.start_controllers(layout)
    control_plane.start_kwok(layout)
    _step("installing the LeaderWorkerSet CRD and webhooks, starting its controller")
    lws.install(layout, functools.partial(kubectl, layout))
    lws.start(layout)
    manifests = [*nodes.all_nodes(), *prometheus.RBAC]
    kubectl(layout, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))
    daemons.wait_for("nodes", lambda: _nodes_ready(layout, len(nodes.all_nodes())), 90, layout.logs / "kwok.log")
    _step("starting the process kubelet")
    daemons.start(layout, "kubelet", [sys.executable, "-m", "xpyd_cluster.kubelet"])
    daemons.wait_for(
        "default service account",
        lambda: _has_default_sa(layout),
        60,
        layout.logs / "kube-controller-manager.log",
    )
    lws.wait_ready(layout, functools.partial(kubectl, layout))
    if with_prometheus:
        _step(f"starting prometheus at {layout.prometheus_url}")
        prometheus.start(layout)
    print(node_table(layout))
    print(f"cluster up in {time.monotonic() - started:.1f}s; logs in {layout.logs}", file=sys.stderr)
    print(f"export KUBECONFIG={layout.kubeconfig}")


def _has_default_sa(layout: Layout) -> bool:
    try:
        kubectl(layout, "get", "serviceaccount", "default", "-n", "default")
    except RuntimeError:
        return False
    return True


def down(layout: Layout) -> None:
    daemons.stop(layout, "kubelet", grace=15)  # pods first, gracefully
    killed = daemons.kill_all(layout)
    if layout.state.exists():
        shutil.rmtree(layout.state)
    print(f"cluster down ({killed} processes stopped)", file=sys.stderr)


def summarize(items: list[dict[str, Any]]) -> list[tuple[str, str, int, int]]:
    """(topology, NVLink domain, nodes, GPUs) rows from a node list: pure, for the table."""
    rows: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for n in items:
        labels = n["metadata"].get("labels", {})
        topo = nodes.topology_of(labels)
        domain = nodes.nvlink_domain_of(labels)
        gpus = int(n.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))
        rows[(topo, domain)]["nodes"] += 1
        rows[(topo, domain)]["gpus"] += gpus
    return [(t, d, c["nodes"], c["gpus"]) for (t, d), c in sorted(rows.items())]


def node_table(layout: Layout) -> str:
    items = json.loads(kubectl(layout, "get", "nodes", "-o", "json"))["items"]
    lines = [f"{'TOPOLOGY':<13} {'NVLINK DOMAIN':<40} {'NODES':>5} {'GPUS':>5}"]
    lines += [f"{t:<13} {d:<40} {n:>5} {g:>5}" for t, d, n, g in summarize(items)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpyd cluster", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    up_p = sub.add_parser("up", help="start (or resume) the local cluster")
    up_p.add_argument("--no-prometheus", action="store_true")
    sub.add_parser("down", help="stop every process of the local cluster and delete its state")
    sub.add_parser("nodes", help="print the nodes by topology")
    sub.add_parser("env", help="print the export line for KUBECONFIG")
    for action, what in (("stop", "stop one component (fault tests)"), ("start", "start a stopped component")):
        one = sub.add_parser(action, help=what)
        one.add_argument("component", choices=sorted(RESTARTABLE))
    ns = parser.parse_args(argv)
    layout = default_layout()
    if ns.action == "nodes" and not (layout.bin / "kubectl").exists():
        print("xpyd cluster: the cluster's binaries are not built yet; run 'make cluster-up'", file=sys.stderr)
        return 2
    if ns.action in ("nodes", "env") and not layout.kubeconfig.exists():
        print("xpyd cluster: the local cluster is not running; start it with 'make cluster-up'", file=sys.stderr)
        return 2
    if ns.action in ("stop", "start") and not layout.kubeconfig.exists():
        print("xpyd cluster: the local cluster is not running; start it with 'make cluster-up'", file=sys.stderr)
        return 2
    if ns.action == "stop":
        daemons.stop(layout, ns.component, grace=5)
    elif ns.action == "start":
        RESTARTABLE[ns.component](layout)
    elif ns.action == "up":
        up(layout, with_prometheus=not ns.no_prometheus)
    elif ns.action == "down":
        down(layout)
    elif ns.action == "nodes":
        print(node_table(layout))
    else:
        print(f"export KUBECONFIG={layout.kubeconfig}")
    return 0
