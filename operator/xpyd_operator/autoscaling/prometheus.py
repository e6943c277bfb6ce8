"""A small client for Prometheus's HTTP query API that turns every failure into one clear reason."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from xpyd_api.engines import VLLM_METRICS, MetricNames

from . import datapath
from .promql import RATE_WINDOW, ROLE_LABEL, held_query, pool_queries
from .types import PoolMetrics, PrometheusError


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float  # NaN where Prometheus said NaN (e.g. a quantile of an empty histogram)
    timestamp: float


class PrometheusClient:
    """``await client.query(promql)`` against ``<base_url>/api/v1/query``."""

    def __init__(
        self, base_url: str, *, timeout: float = 5.0, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"prometheusUrl must start with http:// or https://, got {base_url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant vector; raises PrometheusError on any transport, HTTP or API failure."""
        params = {"query": promql, "timeout": f"{self.timeout:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            resp = await self._http.get("/api/v1/query", params=params)
        except httpx.TimeoutException as exc:
            raise PrometheusError(
                "PrometheusTimeout", f"{self.base_url} did not answer within {self.timeout:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise PrometheusError("PrometheusUnreachable", f"{self.base_url}: {exc!r}") from exc
        body = _json(resp)
        if resp.status_code != 200 or body.get("status") != "success":
            err = body.get("error") or resp.text[:200]
            raise PrometheusError(
                "PrometheusQueryFailed", f"HTTP {resp.status_code} {body.get('errorType', '')}: {err}"
            )
        return _vector(body.get("data"))

    async def observe(
        self,
        namespace: str,
        deployment: str,
        roles: Collection[str],
        *,
        stale_after: float = 60.0,
        rate_window: str = RATE_WINDOW,
        at: float | None = None,
        metrics: MetricNames = VLLM_METRICS,
    ) -> dict[str, PoolMetrics]:
        """Every pool's metrics, from concurrent instant queries scoped to the deployment's pods, in the
        metric names of its engine."""
        queries = pool_queries(namespace, deployment, stale_after, rate_window, metrics)
        held_q = held_query(namespace, deployment)
        *answers, held = await asyncio.gather(*(self.query(q, at) for q in (*queries.values(), held_q)))
        per_role: dict[str, dict[str, Any]] = {r: {} for r in roles}
        for field, samples in zip(queries, answers, strict=True):
            for s in samples:
                role = s.labels.get(ROLE_LABEL)
                if role in per_role and not math.isnan(s.value) and not math.isinf(s.value):
                    per_role[role][field] = int(s.value) if field == "reporting" else s.value
        if held and math.isfinite(held[0].value):  # the routers' waiting rooms: the deployment's, on every pool
            for fields in per_role.values():
                fields["held"] = held[0].value
        return {role: PoolMetrics(**fields) for role, fields in per_role.items()}

    async def pairs(
        self, namespace: str, deployment: str, *, window: str = datapath.WINDOW, at: float | None = None
    ) -> datapath.PairsHealth:
        """The deployment's routers' prefill/decode pairs: how many are out of pairing now, and which tripped."""
        cooling, trips = await asyncio.gather(
            *(self.query(q, at) for q in datapath.queries(namespace, deployment, window))
        )
        return datapath.pairs_health((s.value for s in cooling), (s.labels for s in trips))


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise PrometheusError(
            "PrometheusBadResponse", f"HTTP {resp.status_code}, not a JSON object: {resp.text[:200]!r}"
        )
    return body


def _vector(data: Any) -> list[Sample]:
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusError("PrometheusBadResponse", f"expected an instant vector, got {str(data)[:200]}")
    out = []
    try:
        for item in data["result"]:
            ts, value = item["value"]
            out.append(Sample(dict(item.get("metric", {})), float(value), float(ts)))
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusError("PrometheusBadResponse", f"malformed vector: {exc!r}") from exc
    return out
