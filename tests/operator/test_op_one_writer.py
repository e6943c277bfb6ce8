"""One writer of replicas: the autoscaler writes its decision to status, the reconciler applies it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes  # type: ignore[import-not-found]

from xpyd_api.engines import MetricNames
from xpyd_operator.autoscaling.datapath import PairsHealth, Trip
from xpyd_operator.autoscaling.loop import FIELD_MANAGER, autoscale
from xpyd_operator.autoscaling.types import PoolMetrics, PrometheusError
from xpyd_operator.kube import DD
from xpyd_operator.reconcile import Config, Reconciler

NOW = 1_800_000_000.0
SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "topology": {"kind": "HGX-B200"},
    "prefill": {"replicas": 2, "gpusPerReplica": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
    "decode": {"replicas": 4, "gpusPerReplica": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 16}},
    "autoscaling": {"enabled": True},
}
BUSY = {
    "prefill": PoolMetrics(waiting=20.0, running=4.0, reporting=2, sampled_at=NOW - 2),
    "decode": PoolMetrics(waiting=0.0, kv_usage=0.5, reporting=4, sampled_at=NOW - 2),
}
IDLE_HOLD = {
    "prefill": PoolMetrics(waiting=4.0, reporting=2, sampled_at=NOW - 2),
    "decode": PoolMetrics(waiting=0.0, kv_usage=0.7, reporting=4, sampled_at=NOW - 2),
}


class _Obj:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


class FakeClient:
    """The lightkube calls the autoscaler makes, served from the reconciler's in-memory API server."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.patches: list[tuple[Any, str, dict[str, Any], str | None]] = []

    async def _items(self) -> AsyncIterator[_Obj]:
        for _ in ():
            yield _Obj({})

    def list(self, res: Any, **kw: Any) -> AsyncIterator[_Obj]:
        return self._items()  # no pods: none Pending

    async def get(self, res: Any, name: str, namespace: str) -> _Obj:
        return _Obj(self.kube.objects[("StatefulSet", name)])

    async def patch(self, res: Any, name: str, body: dict[str, Any], **kw: Any) -> None:
        self.patches.append((res, name, body, kw.get("field_manager")))


class FakePrometheus:
    def __init__(self, answer: dict[str, PoolMetrics] | PrometheusError, pairs: PairsHealth | None = None) -> None:
        self.answer = answer
        self.pairs_answer = pairs or PairsHealth(0.0)

    async def observe(
        self, ns: str, name: str, roles: list[str], stale_after: float, metrics: MetricNames
    ) -> dict[str, PoolMetrics]:
        if isinstance(self.answer, PrometheusError):
            raise self.answer
        return self.answer

    async def pairs(self, ns: str, name: str) -> PairsHealth:
        return self.pairs_answer


async def _scaled(
    metrics: dict[str, PoolMetrics] | PrometheusError, pairs: PairsHealth | None = None
) -> tuple[FakeKube, FakeClient, list[str]]:
    kube = FakeKube(SPEC, b200_nodes())
    reconciler = Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t"))
    await reconciler.reconcile(OWNER.namespace, OWNER.name)
    kube.settle()
    client, enqueued = FakeClient(kube), []
    assert kube.dd is not None
    await autoscale(
        client,  # type: ignore[arg-type]
        kube.dd,
        FakePrometheus(metrics, pairs),  # type: ignore[arg-type]
        enqueue=lambda ns, name: enqueued.append(f"{ns}/{name}"),
        now=NOW,
    )
    # The API server keeps both managers' status fields (server-side apply); the fake keeps the autoscaler's.
    kube.dd.setdefault("status", {})["autoscaler"] = client.patches[-1][2]["status"]["autoscaler"]
    await reconciler.reconcile(OWNER.namespace, OWNER.name)
    return kube, client, enqueued


def _replicas(kube: FakeKube) -> dict[str, int]:
    return {role: kube.objects[("StatefulSet", f"llama-{role}")]["spec"]["replicas"] for role in ("prefill", "decode")}


@pytest.mark.parametrize(
    ("metrics", "replicas", "enqueued"),
    [
        (BUSY, {"prefill": 6, "decode": 4}, ["ns1/llama"]),  # a new size: the reconciler is asked at once
        (IDLE_HOLD, {"prefill": 2, "decode": 4}, []),  # no change: no extra reconcile
        (PrometheusError("PrometheusUnreachable", "down"), {"prefill": 2, "decode": 4}, []),
    ],
)
async def test_the_autoscaler_writes_status_and_the_reconciler_sizes(
    metrics: dict[str, PoolMetrics] | PrometheusError, replicas: dict[str, int], enqueued: list[str]
) -> None:
    kube, client, asked = await _scaled(metrics)
    assert [(res, manager) for res, _, _, manager in client.patches] == [(DD.Status, FIELD_MANAGER)]
    assert asked == enqueued
    assert _replicas(kube) == replicas


def _conditions(client: FakeClient) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in client.patches[-1][2]["status"]["conditions"]}


@pytest.mark.parametrize(
    ("metrics", "pairs", "kv"),
    [
        (IDLE_HOLD, None, ("True", "PairsInRotation")),
        (IDLE_HOLD, PairsHealth(1.0, (Trip("p0", "d0", "failures"),)), ("False", "PairsCoolingOff")),
        (IDLE_HOLD, PairsHealth(None), ("Unknown", "RouterMetricsMissing")),
        (PrometheusError("PrometheusUnreachable", "down"), None, ("Unknown", "PrometheusUnavailable")),
    ],
)
async def test_the_autoscaler_writes_the_kv_data_path_beside_its_health(
    metrics: dict[str, PoolMetrics] | PrometheusError, pairs: PairsHealth | None, kv: tuple[str, str]
) -> None:
    """One apply holds both of the autoscaler's conditions (a map by type: omitting one would drop it)."""
    _, client, _ = await _scaled(metrics, pairs)
    conds = _conditions(client)
    assert set(conds) == {"AutoscalerHealthy", "KvDataPathHealthy"}
    assert conds["KvDataPathHealthy"] == kv
