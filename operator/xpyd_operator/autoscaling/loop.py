"""The autoscaler loop inside the operator: one task per DisaggregatedDeployment with autoscaling on.

Each period it reads the pools' StatefulSets and pods, queries Prometheus, runs the pure policy and
writes the decision to ``status.autoscaler`` with the ``AutoscalerHealthy`` condition, and the routers'
pairs to ``KvDataPathHealthy`` (``datapath``; field manager ``xpyd-autoscaler``). It never writes replicas:
the reconciler sizes autoscaled pools from that status (one writer of replicas) and is asked to reconcile
at once when a size should change.
All its memory is in that status, so a restarted operator carries on where the old one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType
from pydantic import ValidationError

from xpyd_api import labels
from xpyd_api.engines import METRICS
from xpyd_api.models import Condition, DisaggregatedDeploymentSpec, DisaggregatedDeploymentStatus
from xpyd_operator.kube import DD, LeaderWorkerSet, as_dict

from . import datapath
from .metrics import AutoscalerMetrics, default_metrics
from .prometheus import PrometheusClient
from .spec import AutoscaleResult, PoolRuntime, evaluate, managed_pools, pool_runtime
from .types import PoolMetrics, PrometheusError

log = logging.getLogger("xpyd.autoscaler")
FIELD_MANAGER = "xpyd-autoscaler"
Enqueue = Callable[[str, str], None]  # asks the reconciler for a pass over (namespace, name)


def typed_spec(obj: Mapping[str, Any]) -> DisaggregatedDeploymentSpec | None:
    """The object's spec as the models read it; None when invalid (the reconciler reports that)."""
    try:
        return DisaggregatedDeploymentSpec.model_validate(obj.get("spec") or {})
    except ValidationError:
        return None


async def autoscale(
    client: AsyncClient,
    obj: Mapping[str, Any],
    prometheus: PrometheusClient,
    *,
    enqueue: Enqueue | None = None,
    now: float | None = None,
    free_gpus: int | None = None,
    metrics: AutoscalerMetrics | None = None,
    dry_run: bool = False,
) -> AutoscaleResult | None:
    """One autoscaling period for ``obj`` (a DisaggregatedDeployment as read); None if nothing is managed."""
    meta = obj["metadata"]
    name, ns = meta["name"], meta["namespace"]
    spec = typed_spec(obj)
    pools = managed_pools(spec) if spec is not None else {}
    if spec is None or not pools:
        return None
    pods = [p.to_dict() async for p in client.list(Pod, namespace=ns, labels={labels.DEPLOYMENT: name})]
    runtimes: dict[str, PoolRuntime] = {}
    layouts = spec.layouts()
    for role in pools:
        kind = LeaderWorkerSet if layouts[role].multi_node else StatefulSet
        try:
            sts = as_dict(await client.get(kind, f"{name}-{role}", namespace=ns))
        except ApiError as exc:
            if exc.status.code == 404:
                continue  # not created yet: the reconciler's job
            raise
        runtimes[role] = pool_runtime(sts, pods, role)
    if not runtimes:
        return None
    answer: Mapping[str, PoolMetrics] | PrometheusError
    try:
        stale, names = spec.autoscaling.stale_after(), METRICS[spec.engine.kind]
        answer = await prometheus.observe(ns, name, list(runtimes), stale_after=stale, metrics=names)
    except PrometheusError as exc:
        answer = exc
    pairs: datapath.PairsHealth | PrometheusError | None = None
    if spec.mode == "Disaggregated":  # the routers' pairs (a Colocated deployment has none)
        try:
            pairs = answer if isinstance(answer, PrometheusError) else await prometheus.pairs(ns, name)
        except PrometheusError as exc:
            pairs = exc
    status = DisaggregatedDeploymentStatus.read(obj.get("status"))
    clock = time.time() if now is None else now
    result = evaluate(spec, status, meta.get("generation"), runtimes, answer, clock, free_gpus=free_gpus)
    if not dry_run:
        kv = [] if pairs is None else [datapath.condition(pairs, status.conditions, clock, meta.get("generation"))]
        await _write_status(client, ns, name, result, kv)
        moved = {r: want for r, want in result.desired.items() if want != runtimes[r].replicas}
        for role, want in moved.items():
            why = result.decision.pools[role].message
            log.info("%s/%s %s: %d -> %d (%s)", ns, name, role, runtimes[role].replicas, want, why)
        if moved and enqueue is not None:
            enqueue(ns, name)  # the reconciler applies the new sizes now, not at the next resync
    (metrics or default_metrics()).record(
        ns,
        name,
        result.decision,
        {r: rt.replicas for r, rt in runtimes.items()},
        {r: rt.ready for r, rt in runtimes.items()},
        spec.slo,
    )
    return result


async def _write_status(
    client: AsyncClient, ns: str, name: str, result: AutoscaleResult, more: list[Condition]
) -> None:
    """One apply of the autoscaler's status; every condition it owns each time (conditions: a map by type)."""
    body = {
        "apiVersion": f"{labels.GROUP}/{labels.VERSION}",
        "kind": labels.KIND,
        "metadata": {"name": name, "namespace": ns},
        "status": {
            "autoscaler": result.status,
            "conditions": [c.model_dump(by_alias=True, exclude_none=True) for c in (result.condition, *more)],
        },
    }
    await client.patch(
        DD.Status, name, body, namespace=ns, patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True
    )


class Autoscalers:
    """One loop per deployment with autoscaling on; a loop ends by itself when that goes off or the object goes."""

    def __init__(self, client: AsyncClient, enqueue: Enqueue) -> None:
        self.client = client
        self.enqueue = enqueue
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def ensure(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Start a loop for each object with autoscaling on that has none running."""
        for obj in objects:
            spec = typed_spec(obj)
            if spec is None or not spec.autoscaling.enabled:
                continue
            meta = obj["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            task = self.tasks.get(key)
            if task is None or task.done():
                self.tasks[key] = asyncio.create_task(
                    self._loop(meta["namespace"], meta["name"]), name=f"autoscale {key}"
                )

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()

    async def _loop(self, ns: str, name: str) -> None:
        """Autoscale one object every spec.autoscaling.intervalSeconds until it is gone or turned off."""
        prom: PrometheusClient | None = None
        try:
            while True:
                try:
                    obj = as_dict(await self.client.get(DD, name, namespace=ns))
                except ApiError as exc:
                    if exc.status.code == 404:
                        return
                    raise
                spec = typed_spec(obj)
                if spec is None or not spec.autoscaling.enabled:
                    return
                url = spec.autoscaling.prometheus_url
                if prom is None or prom.base_url != url.rstrip("/"):
                    if prom is not None:
                        await prom.aclose()
                    prom = PrometheusClient(url)
                try:
                    await autoscale(self.client, obj, prom, enqueue=self.enqueue)
                except Exception:
                    log.exception("autoscaling %s/%s failed", ns, name)
                await asyncio.sleep(float(spec.autoscaling.interval_seconds))
        finally:
            if prom is not None:
                await prom.aclose()
