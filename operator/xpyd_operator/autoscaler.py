"""The autoscaler loop inside the operator: one task per DisaggregatedDeployment with autoscaling on.

Each period it reads the pools' StatefulSets and pods, queries Prometheus, runs the pure policy,
patches the StatefulSets' replicas (field manager ``xpyd-autoscaler``) and writes
``status.autoscaler`` and the ``AutoscalerHealthy`` condition. All its memory is in that status,
so a restarted operator carries on where the old one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from xpyd_api import labels

from . import hooks
from .autoscaling_baselines import Policy
from .autoscaling_metrics import AutoscalerMetrics, default_metrics
from .autoscaling_policy import XpydPolicy
from .autoscaling_prometheus import PoolMetrics, PrometheusClient, PrometheusError
from .autoscaling_spec import PoolRuntime, history, managed_pools, policy_inputs, pool_runtime, status_patch
from .autoscaling_types import Decision

log = logging.getLogger("xpyd.autoscaler")
FIELD_MANAGER = "xpyd-autoscaler"


@dataclass(frozen=True)
class AutoscaleResult:
    desired: dict[str, int]  # replicas per managed pool
    status: dict[str, Any]  # the value of status.autoscaler
    condition: dict[str, Any]  # the AutoscalerHealthy condition
    decision: Decision


def evaluate(
    obj: Mapping[str, Any],
    runtimes: Mapping[str, PoolRuntime],
    metrics: Mapping[str, PoolMetrics] | PrometheusError,
    now: float,
    *,
    free_gpus: int | None = None,
    policy: Policy | None = None,
) -> AutoscaleResult:
    """The whole decision for one object, without I/O."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    error = metrics if isinstance(metrics, PrometheusError) else None
    inputs = policy_inputs(spec, runtimes, None if error else metrics, free_gpus)  # type: ignore[arg-type]
    decision = (policy or XpydPolicy()).decide(inputs, history(status), now)
    generation = (obj.get("metadata") or {}).get("generation")
    auto, cond = status_patch(status, decision, runtimes, error, now, generation)
    return AutoscaleResult({r: d.desired for r, d in decision.pools.items()}, auto, cond, decision)


async def autoscale(
    client: AsyncClient,
    obj: Mapping[str, Any],
    prometheus: PrometheusClient,
    *,
    now: float | None = None,
    free_gpus: int | None = None,
    metrics: AutoscalerMetrics | None = None,
    dry_run: bool = False,
) -> AutoscaleResult | None:
    """One autoscaling period for ``obj`` (a DisaggregatedDeployment dict); None if nothing is managed."""
    meta = obj["metadata"]
    name, ns = meta["name"], meta["namespace"]
    spec = obj.get("spec") or {}
    pools = managed_pools(spec)
    if not pools:
        return None
    pods = [p.to_dict() async for p in client.list(Pod, namespace=ns, labels={labels.DEPLOYMENT: name})]
    runtimes: dict[str, PoolRuntime] = {}
    for role in pools:
        try:
            sts = (await client.get(StatefulSet, f"{name}-{role}", namespace=ns)).to_dict()
        except ApiError as exc:
            if exc.status.code == 404:
                continue  # not created yet: the reconciler's job
            raise
        runtimes[role] = pool_runtime(sts, pods, role)
    if not runtimes:
        return None
    scaling = spec.get("autoscaling") or {}
    stale = float(scaling.get("staleAfterSeconds") or max(60.0, 4 * float(scaling.get("intervalSeconds", 15))))
    answer: Mapping[str, PoolMetrics] | PrometheusError
    try:
        answer = await prometheus.observe(ns, name, list(runtimes), stale_after=stale)
    except PrometheusError as exc:
        answer = exc
    result = evaluate(obj, runtimes, answer, time.time() if now is None else now, free_gpus=free_gpus)
    if not dry_run:
        # Status first: the reconciler sizes autoscaled pools from status.autoscaler, so it never undoes a scale.
        await _write_status(client, ns, name, result)
        for role, want in result.desired.items():
            if want != runtimes[role].replicas:
                log.info(
                    "%s/%s %s: %d -> %d (%s)",
                    ns,
                    name,
                    role,
                    runtimes[role].replicas,
                    want,
                    result.decision.pools[role].message,
                )
                await _scale(client, ns, f"{name}-{role}", want)
    (metrics or default_metrics()).record(
        ns,
        name,
        result.decision,
        {r: rt.replicas for r, rt in runtimes.items()},
        {r: rt.ready for r, rt in runtimes.items()},
    )
    return result


async def _scale(client: AsyncClient, ns: str, sts: str, replicas: int) -> None:
    body = {"spec": {"replicas": replicas}}
    await client.patch(StatefulSet, sts, body, namespace=ns, patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER)


async def _write_status(client: AsyncClient, ns: str, name: str, result: AutoscaleResult) -> None:
    from .kube import DD  # the reconciler's resource type for DisaggregatedDeployment

    body = {
        "apiVersion": f"{labels.GROUP}/{labels.VERSION}",
        "kind": labels.KIND,
        "metadata": {"name": name, "namespace": ns},
        "status": {"autoscaler": result.status, "conditions": [result.condition]},
    }
    await client.patch(
        DD.Status,
        name,
        body,
        namespace=ns,
        patch_type=PatchType.APPLY,
        field_manager=FIELD_MANAGER,
        force=True,
    )


async def _loop(client: AsyncClient, ns: str, name: str) -> None:
    """Autoscale one object every spec.autoscaling.intervalSeconds until it is gone or turned off."""
    from .kube import DD, as_dict

    prom: PrometheusClient | None = None
    try:
        while True:
            try:
                obj = as_dict(await client.get(DD, name, namespace=ns))
            except ApiError as exc:
                if exc.status.code == 404:
                    return
                raise
            scaling = (obj.get("spec") or {}).get("autoscaling") or {}
            if not scaling.get("enabled"):
                return
            url = scaling.get("prometheusUrl", "http://prometheus.monitoring:9090")
            if prom is None or prom.base_url != url.rstrip("/"):
                if prom is not None:
                    await prom.aclose()
                prom = PrometheusClient(url)
            try:
                await autoscale(client, obj, prom)
            except Exception:
                log.exception("autoscaling %s/%s failed", ns, name)
            await asyncio.sleep(float(scaling.get("intervalSeconds", 15)))
    finally:
        if prom is not None:
            await prom.aclose()


@hooks.on_resync
async def ensure_loops(ctx: hooks.ResyncContext) -> None:
    """Start a loop for each object with autoscaling on; loops end by themselves when it goes off."""
    tasks: dict[str, asyncio.Task[None]] = ctx.memo.setdefault("autoscaler_tasks", {})
    for obj in ctx.objects:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if not ((obj.get("spec") or {}).get("autoscaling") or {}).get("enabled"):
            continue
        task = tasks.get(key)
        if task is None or task.done():
            tasks[key] = asyncio.create_task(_loop(ctx.client, meta["namespace"], meta["name"]))
