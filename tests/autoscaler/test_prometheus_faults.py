"""The Prometheus client's fault handling, against a stand-in transport (not Prometheus semantics)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import yaml

from xpyd_operator.autoscaling.prometheus import PrometheusClient
from xpyd_operator.autoscaling.promql import SCRAPE_CONFIG, held_query, pool_queries, selector
from xpyd_operator.autoscaling.types import PrometheusError

URL = "http://127.0.0.1:9"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> PrometheusClient:
    return PrometheusClient(URL, timeout=0.5, transport=httpx.MockTransport(handler))


def vector(*items: tuple[dict[str, str], str]) -> httpx.Response:
    result = [{"metric": m, "value": [1700000000.5, v]} for m, v in items]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


def raise_(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(_req: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("handler", "reason", "text"),
    [
        (raise_(httpx.ConnectError("refused")), "PrometheusUnreachable", "refused"),
        (raise_(httpx.ReadTimeout("slow")), "PrometheusTimeout", "within 0.5s"),
        (lambda r: httpx.Response(503, text="overloaded"), "PrometheusBadResponse", "503"),
        (
            lambda r: httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"}),
            "PrometheusQueryFailed",
            "bad_data: parse error",
        ),
        (
            lambda r: httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix"}}),
            "PrometheusBadResponse",
            "instant vector",
        ),
        (
            lambda r: httpx.Response(
                200, json={"status": "success", "data": {"resultType": "vector", "result": [{"x": 1}]}}
            ),
            "PrometheusBadResponse",
            "malformed",
        ),
        (lambda r: httpx.Response(200, json=[1, 2]), "PrometheusBadResponse", "not a JSON object"),
    ],
)
async def test_failures_become_reasons(
    handler: Callable[[httpx.Request], httpx.Response], reason: str, text: str
) -> None:
    async with client(handler) as c:
        with pytest.raises(PrometheusError, match=text) as info:
            await c.query("up")
    assert info.value.reason == reason


async def test_query_sends_promql_and_time() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return vector(({"xpyd_role": "prefill"}, "3"), ({"xpyd_role": "decode"}, "NaN"))

    async with client(handler) as c:
        samples = await c.query('sum(up{a="b"})', at=12.5)
    assert seen[0].url.path == "/api/v1/query"
    assert seen[0].url.params["query"] == 'sum(up{a="b"})'
    assert seen[0].url.params["time"] == "12.500"
    assert next(s.value for s in samples) == 3.0


async def test_observe_maps_roles_and_drops_nan() -> None:
    queries = pool_queries("ns", "llama", 60)

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.params["query"] == held_query("ns", "llama"):  # the routers' held requests: one value
            return vector(({}, "3"))
        field = next(k for k, q in queries.items() if q == req.url.params["query"])
        if field == "ttft_p90":
            return vector(({"xpyd_role": "prefill"}, "NaN"))
        if field == "kv_usage":
            return vector(({"xpyd_role": "decode"}, "0.5"), ({"xpyd_role": "router"}, "1"))
        return vector(({"xpyd_role": "prefill"}, "4"), ({"xpyd_role": "decode"}, "2"))

    async with client(handler) as c:
        got = await c.observe("ns", "llama", ["prefill", "decode"])
    assert got["prefill"].ttft_p90 is None
    assert (got["prefill"].waiting, got["prefill"].reporting, got["prefill"].kv_usage) == (4.0, 4, None)
    assert got["decode"].kv_usage == 0.5
    assert set(got) == {"prefill", "decode"}
    assert got["prefill"].held == got["decode"].held == 3.0  # the deployment's figure, on every pool


async def test_observe_with_no_series_leaves_everything_missing() -> None:
    async with client(lambda r: vector()) as c:
        got = await c.observe("ns", "llama", ["prefill"])
    assert got["prefill"].sampled_at is None
    assert got["prefill"].waiting is None


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda: PrometheusClient("prometheus:9090"), "must start with http"),
        (lambda: PrometheusClient(URL, timeout=0), "timeout must be > 0"),
        (lambda: selector("", "x"), "non-empty"),
    ],
)
def test_bad_config_is_refused(bad: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bad()


def test_selector_quotes_values() -> None:
    assert selector("n", 'a"b') == 'namespace="n",xpyd_deployment="a\\"b"'


def test_scrape_config_relabels_pod_labels() -> None:
    (job,) = yaml.safe_load(SCRAPE_CONFIG)
    targets = {r.get("target_label"): r["source_labels"][0] for r in job["relabel_configs"]}
    assert targets["xpyd_deployment"] == "__meta_kubernetes_pod_label_xpyd_io_deployment"
    assert targets["xpyd_role"] == "__meta_kubernetes_pod_label_xpyd_io_role"
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
