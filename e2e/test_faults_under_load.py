"""Faults under steady load through the router: pool scale-downs, an engine upgrade, control-plane restarts.

Every case counts what the clients saw (ok, failed cleanly, lost, hung; testkit/outcomes.py)
and asserts nothing was lost and nothing hung. `bench/reliability/run.py` runs the same cases for
longer (XPYD_FAULT_SECONDS) and collects their rows (XPYD_FAULT_ROWS) into bench/results/reliability.md.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.types import PatchType
from testkit.outcomes import CLEAN, HUNG, LOST, OK, Load, Tally, row, run_load
from testkit.promtext import metric_sum

from xpyd_api import labels as L
from xpyd_api import metric_names as names

from .kube import is_local_cluster
from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube, op_namespace, operator_proc, dd)
from .operator_fixtures import DD, Kube, converged, pods_of, role_of, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
SECONDS = float(os.environ.get("XPYD_FAULT_SECONDS", "20"))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OLD, NEW = "vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.12.0"
XPYD = Path(sys.executable).with_name("xpyd")
PROMETHEUS = os.environ.get("XPYD_PROMETHEUS_URL", "http://127.0.0.1:9090")


@pytest.fixture(autouse=True)
def _local_only() -> None:
    if not is_local_cluster():
        pytest.skip("needs the local cluster: its pod IPs (loopback) are reachable from this process")


def record(case: str, tally: Tally, fault_at: float, note: str = "") -> None:
    out = os.environ.get("XPYD_FAULT_ROWS")
    if out:
        with Path(out).open("a") as f:
            f.write(row(case, tally, fault_at, note) + "\n")


def router_url(kube: Kube, ns: str, name: str) -> str | None:
    for pod in pods_of(kube, ns, name):
        if role_of(pod) != "router" or pod.status is None or pod.metadata.deletionTimestamp is not None:
            continue
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if ready and pod.status.podIP:
            return f"http://{pod.status.podIP}:{L.ROUTER_PORT}"
    return None


def serving(kube: Kube, ns: str, name: str, xpyd: str) -> str:
    """Waits until the deployment is Ready at `xpyd` and its router answers a request; returns the router URL."""
    wait_for(lambda: converged(kube, ns, name, xpyd), 180, what=f"{name} Ready at {xpyd}")
    url = wait_for(lambda: router_url(kube, ns, name), 60, what=f"{name}'s router Ready")

    def answers() -> bool:
        tally, _ = asyncio.run(run_load(Load(url, MODEL, rate=2, seconds=1, deadline_s=20)))
        return tally.counts[OK] == tally.total > 0

    wait_for(answers, 60, interval=1, what=f"{name}'s router to serve a request")
    return url


def patch_spec(kube: Kube, ns: str, name: str, body: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    async def act() -> None:
        await asyncio.to_thread(kube.client.patch, DD, name, {"spec": body}, namespace=ns, patch_type=PatchType.MERGE)

    return act


def assert_nothing_lost(tally: Tally, fault_at: float) -> None:
    assert tally.total > 0
    assert tally.in_flight_at(fault_at) > 0, "the fault should hit requests in flight"
    assert tally.counts[LOST] == 0, tally.counts
    assert tally.counts[HUNG] == 0, tally.counts
    assert tally.counts[OK] > tally.counts[CLEAN], tally.counts


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_scale_down_under_load_loses_nothing(dd: Any, op_kube: Kube, op_namespace: str, role: str) -> None:
    name = f"shrink-{role}"
    dd(name, prefill={"replicas": 2, "gpusPerReplica": 2}, decode={"replicas": 2, "gpusPerReplica": 2})
    url = serving(op_kube, op_namespace, name, "2P2D")
    act = patch_spec(op_kube, op_namespace, name, {role: {"replicas": 1, "gpusPerReplica": 2}})
    load = Load(url, MODEL, rate=8, seconds=SECONDS, max_tokens=400)
    tally, fault_at = asyncio.run(run_load(load, act, at_s=SECONDS / 3))
    record(f"scale-down of {role} 2 -> 1 under load", tally, fault_at)
    assert_nothing_lost(tally, fault_at)
    want = "2P1D" if role == "decode" else "1P2D"
    wait_for(lambda: converged(op_kube, op_namespace, name, want), 120, what=f"{name} at {want}")


def images(kube: Kube, ns: str, name: str, role: str) -> dict[str, int]:
    status = kube.get_dd(ns, name).get("status") or {}
    return dict((status.get(role) or {}).get("images") or {})


def ready_by_revision(kube: Kube, ns: str, name: str) -> dict[str, dict[str, int]]:
    """Engine revision -> role -> ready engine pods, read from the pods themselves."""
    out: dict[str, dict[str, int]] = {}
    for pod in pods_of(kube, ns, name):
        role = role_of(pod)
        if role not in ("prefill", "decode") or pod.status is None or pod.metadata.deletionTimestamp is not None:
            continue
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            roles = out.setdefault(pod.metadata.labels.get(L.ENGINE_REV, ""), {"prefill": 0, "decode": 0})
            roles[role] += 1
    return out


def test_engine_upgrade_moves_both_pools_in_step_and_loses_nothing(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    name = "upgrade"
    dd(name, engine={"image": OLD}, prefill={"replicas": 1, "gpusPerReplica": 2},
       decode={"replicas": 2, "gpusPerReplica": 2})  # fmt: skip
    url = serving(op_kube, op_namespace, name, "1P2D")
    seen: list[dict[str, dict[str, int]]] = []

    async def upgrade_and_watch() -> None:
        await patch_spec(op_kube, op_namespace, name, {"engine": {"image": NEW}})()

        async def watch() -> None:
            while True:
                seen.append(await asyncio.to_thread(ready_by_revision, op_kube, op_namespace, name))
                await asyncio.sleep(0.5)

        asyncio.get_running_loop().create_task(watch())

    # prompts long enough that every request goes through a prefill and its KV is handed over (short ones go
    # straight to decode), so each handoff is one a worker of the other release would refuse
    load = Load(url, MODEL, rate=8, seconds=max(SECONDS, 45), max_tokens=400, prompt_words=1500)
    tally, fault_at = asyncio.run(run_load(load, upgrade_and_watch, at_s=5))
    pairs = [sum(min(roles.values()) for roles in by_rev.values()) for by_rev in seen]
    # The emulated engines stand in for the release their image names (the local kubelet tells them), and a decode
    # refuses KV from a prefill of another release as vLLM's compatibility hash does: a handoff the router paired
    # across the two releases fails at the decode leg, which the router counts (and retries).
    page = httpx.get(url + "/metrics", timeout=10.0).text
    crossed = metric_sum(page, names.ROUTER_HANDOFF_FAILURES)
    handoffs = metric_sum(page, names.ROUTER_KV_HANDOFFS)
    note = (
        f"both pools in step, surge 1; pairable pods >= {min(pairs, default=0)} at each of {len(pairs)} looks;"
        f" {crossed:.0f} failed handoffs of {handoffs:.0f} (the workers refuse a pair across releases)"
    )
    record("engine upgrade (v0.11.0 -> v0.12.0, both pools) under load", tally, fault_at, note)
    assert_nothing_lost(tally, fault_at)
    assert handoffs > 0 and crossed == 0, page  # nothing paired across the releases: no handoff refused
    wait_for(lambda: images(op_kube, op_namespace, name, "prefill") == {NEW: 1}, 180, what="prefill on the new engine")
    wait_for(lambda: images(op_kube, op_namespace, name, "decode") == {NEW: 2}, 60, what="decode on the new engine")
    assert len(seen) > 10 and len({rev for by_rev in seen for rev in by_rev}) == 2, seen  # it saw both revisions
    assert min(pairs) >= 1, seen  # some revision had a ready prefill and a ready decode pod at every look


def progressing(kube: Kube, ns: str, name: str) -> str:
    status = kube.get_dd(ns, name).get("status") or {}
    return next((c["reason"] for c in status.get("conditions") or [] if c["type"] == "Progressing"), "")


def test_a_crash_looping_engine_revision_is_rolled_back_and_loses_nothing(
    dd: Any, op_kube: Kube, op_namespace: str
) -> None:
    """A new engine revision whose pods cannot start (here: a misspelt engine flag the emulator refuses, as
    vLLM's argparse would) goes back to the old templates; the old pods serve throughout."""
    name = "badrev"
    dd(name, engine={"image": OLD}, prefill={"replicas": 1, "gpusPerReplica": 2},
       decode={"replicas": 2, "gpusPerReplica": 2})  # fmt: skip
    url = serving(op_kube, op_namespace, name, "1P2D")
    bad = {"engine": {"image": NEW, "args": ["--max-num-seqz", "8"]}}
    load = Load(url, MODEL, rate=8, seconds=max(SECONDS, 30), max_tokens=400)
    tally, fault_at = asyncio.run(run_load(load, patch_spec(op_kube, op_namespace, name, bad), at_s=5))
    started = time.monotonic()
    wait_for(lambda: progressing(op_kube, op_namespace, name) == "EngineRevisionRolledBack", 240, what="a rollback")
    wait_for(lambda: images(op_kube, op_namespace, name, "prefill") == {OLD: 1}, 120, what="prefill on the old engine")
    wait_for(lambda: images(op_kube, op_namespace, name, "decode") == {OLD: 2}, 120, what="decode on the old engine")
    back = time.monotonic() - started + load.seconds - 5
    note = f"rolled back; the old pods served throughout, all on the old revision {back:.0f} s after the edit"
    record("engine upgrade to a crash-looping revision under load", tally, fault_at, note)
    assert_nothing_lost(tally, fault_at)
    by_rev = ready_by_revision(op_kube, op_namespace, name)
    assert len(by_rev) == 1 and next(iter(by_rev.values())) == {"prefill": 1, "decode": 2}, by_rev


def cluster(action: str, component: str) -> None:
    """`xpyd cluster stop|start COMPONENT` (the local cluster's own command)."""
    subprocess.run([str(XPYD), "cluster", action, component], check=True, capture_output=True, timeout=150)


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_restart_under_load(dd: Any, op_kube: Kube, op_namespace: str, component: str) -> None:
    """Pods and routers keep serving while the API server (or etcd) is down; the operator carries on after."""
    name = f"restart-{component.split('-')[-1]}"
    dd(name)
    url = serving(op_kube, op_namespace, name, "1P2D")

    async def restart() -> None:
        def bounce() -> None:
            cluster("stop", component)
            time.sleep(3)
            cluster("start", component)

        await asyncio.to_thread(bounce)

    load = Load(url, MODEL, rate=8, seconds=max(SECONDS, 25), max_tokens=400)
    tally, fault_at = asyncio.run(run_load(load, restart, at_s=5))
    record(f"{component} stopped 3 s and restarted under load", tally, fault_at)
    assert_nothing_lost(tally, fault_at)
    # the operator still works: a resize after the restart converges
    wait_for(lambda: _patched(op_kube, op_namespace, name), 60, what="a patch after the restart")
    wait_for(lambda: converged(op_kube, op_namespace, name, "1P3D"), 180, what="resize after the restart")


def autoscaler_health(kube: Kube, ns: str, name: str) -> tuple[str, str] | None:
    cond = kube.condition(ns, name, "AutoscalerHealthy")
    return (cond["status"], cond["reason"]) if cond else None


def test_prometheus_down_holds_sizes_and_says_so(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    name = "blind"
    scaling = {"minReplicas": 1, "maxReplicas": 3}
    dd(name, prefill={"replicas": 1, "gpusPerReplica": 2, "autoscaling": scaling},
       decode={"replicas": 2, "gpusPerReplica": 2, "autoscaling": {"minReplicas": 2, "maxReplicas": 3}},
       autoscaling={"enabled": True, "prometheusUrl": PROMETHEUS, "intervalSeconds": 5})  # fmt: skip
    url = serving(op_kube, op_namespace, name, "1P2D")
    wait_for(lambda: (autoscaler_health(op_kube, op_namespace, name) or ("",))[0] == "True", 90,
             what="AutoscalerHealthy=True")  # fmt: skip
    down_at: list[float] = []

    async def prometheus_down() -> None:
        await asyncio.to_thread(cluster, "stop", "prometheus")
        down_at.append(time.monotonic())

    try:
        load = Load(url, MODEL, rate=4, seconds=max(SECONDS, 25), max_tokens=200)
        tally, fault_at = asyncio.run(run_load(load, prometheus_down, at_s=3))
        health = wait_for(lambda: _unhealthy(op_kube, op_namespace, name), 60, what="AutoscalerHealthy=False")
        status = op_kube.get_dd(op_namespace, name)["status"]
        assert status["xpyd"] == "1P2D", "sizes are held while the autoscaler is blind"
    finally:
        cluster("start", "prometheus")
    record("Prometheus down under load (autoscaler blind)", tally, fault_at, f"AutoscalerHealthy=False {health[1]}")
    assert_nothing_lost(tally, fault_at)
    wait_for(lambda: (autoscaler_health(op_kube, op_namespace, name) or ("",))[0] == "True", 120,
             what="AutoscalerHealthy=True after Prometheus is back")  # fmt: skip


def _unhealthy(kube: Kube, ns: str, name: str) -> tuple[str, str] | None:
    health = autoscaler_health(kube, ns, name)
    return health if health is not None and health[0] == "False" else None


def _patched(kube: Kube, ns: str, name: str) -> bool:
    try:
        body = {"spec": {"decode": {"replicas": 3, "gpusPerReplica": 2}}}
        kube.client.patch(DD, name, body, namespace=ns, patch_type=PatchType.MERGE)
    except Exception:
        return False
    return True
