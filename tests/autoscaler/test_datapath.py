"""KvDataPathHealthy: the routers' pairs out of pairing, from Prometheus's answer to the condition."""

from __future__ import annotations

import httpx
import pytest

from xpyd_api import conditions as C
from xpyd_api.models import ConditionStatus
from xpyd_operator.autoscaling import datapath
from xpyd_operator.autoscaling.datapath import PairsHealth, Trip
from xpyd_operator.autoscaling.prometheus import PrometheusClient
from xpyd_operator.autoscaling.types import PrometheusError

NOW = 1_800_000_000.0
P0, P1, D0 = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.1.1:8000"


@pytest.mark.parametrize(
    ("answer", "status", "reason", "words"),
    [
        (PairsHealth(0.0), "True", "PairsInRotation", ["every prefill/decode pair is in pairing"]),
        (  # tripped a while ago, back in pairing since
            PairsHealth(0.0, (Trip(P0, D0, "slow"),)),
            "True",
            "PairsInRotation",
            [f"back after tripping in the last 10m: {P0} -> {D0} (slow)"],
        ),
        (
            PairsHealth(2.0, (Trip(P0, D0, "failures"), Trip(P1, D0, "slow"))),
            "False",
            "PairsCoolingOff",
            ["hold 2 prefill/decode pairs out of pairing", f"{P0} -> {D0} (failures), {P1} -> {D0} (slow)"],
        ),
        (PairsHealth(1.0), "False", "PairsCoolingOff", ["hold 1 prefill", "none seen (an older trip)"]),
        (
            PairsHealth(6.0, tuple(Trip(f"p{i}", "d", "failures") for i in range(6))),
            "False",
            "PairsCoolingOff",
            ["p3 -> d (failures) and 2 more"],
        ),
        (PairsHealth(None), "Unknown", "RouterMetricsMissing", ["xpyd_router_pairs_cooling_off", "scraped"]),
        (
            PrometheusError("PrometheusTimeout", "did not answer within 5s"),
            "Unknown",
            "PrometheusUnavailable",
            ["PrometheusTimeout: did not answer within 5s"],
        ),
    ],
    ids=["none", "recovered", "cooling", "cooling-old-trip", "many", "no-router-series", "prometheus-error"],
)
def test_condition(
    answer: PairsHealth | PrometheusError, status: ConditionStatus, reason: str, words: list[str]
) -> None:
    cond = datapath.condition(answer, [], NOW, 3)
    assert (cond.type, cond.status, cond.reason, cond.observed_generation) == (
        C.KV_DATA_PATH_HEALTHY,
        status,
        reason,
        3,
    )
    assert cond.last_transition_time == C.rfc3339(NOW)
    for w in words:
        assert w in cond.message


def test_the_transition_time_holds_while_the_status_does() -> None:
    before = datapath.condition(PairsHealth(1.0), [], NOW - 60, 1)
    same = datapath.condition(PairsHealth(3.0, (Trip(P0, D0, "slow"),)), [before], NOW, 1)
    assert same.last_transition_time == before.last_transition_time
    healed = datapath.condition(PairsHealth(0.0), [same], NOW, 1)
    assert (healed.status, healed.last_transition_time) == ("True", C.rfc3339(NOW))


def test_pairs_health_sums_routers_and_dedups_trips() -> None:
    got = datapath.pairs_health(
        [1.0, 2.0, float("nan")],
        [{"prefill": P1, "decode": D0, "reason": "slow"}, {"prefill": P0, "decode": D0, "reason": "failures"}] * 2,
    )
    assert got == PairsHealth(3.0, (Trip(P0, D0, "failures"), Trip(P1, D0, "slow")))
    assert datapath.pairs_health([], []) == PairsHealth(None)


def test_queries_read_the_deployments_routers() -> None:
    cooling, trips = datapath.queries("ns", "llama", "5m")
    assert cooling == 'sum(xpyd_router_pairs_cooling_off{namespace="ns",deployment="llama"})'
    series = 'xpyd_router_pair_trips_total{namespace="ns",deployment="llama"}'
    assert f"increase({series}[5m])" in trips
    assert f"({series} unless {series} offset 5m)" in trips  # a first trip: a new series at 1
    assert trips.count("by (prefill, decode, reason)") == 2


async def test_the_client_asks_both_queries() -> None:
    asked: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        asked.append(q)
        if "pairs_cooling_off" in q:
            result = [{"metric": {}, "value": [NOW, "1"]}]
        else:
            result = [{"metric": {"prefill": P0, "decode": D0, "reason": "failures"}, "value": [NOW, "1"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    async with PrometheusClient("http://127.0.0.1:9", transport=httpx.MockTransport(handler)) as c:
        got = await c.pairs("ns", "llama")
    assert got == PairsHealth(1.0, (Trip(P0, D0, "failures"),))
    assert sorted(asked) == sorted(datapath.queries("ns", "llama"))
