"""A router that serves TLS is scraped over HTTPS by a PodMonitor the operator makes beside it.

The chart's PodMonitor scrapes plain HTTP and drops pods annotated prometheus.io/scheme: https
(tests/chart/test_render.py); this one checks the router's certificate against the TLS Secret's
ca.crt for the Service's DNS name. /metrics needs no API key, so none is configured.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes  # type: ignore[import-not-found]

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import routerkit
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_operator.routerkit import MonitorSettings

TLS = {"tls": {"secretName": "llama-router-tls"}}
KEY = {"apiKeySecret": {"name": "keys", "key": "api-key"}}
MONITOR = MonitorSettings("30s", {"release": "kps"})
RELABEL = [
    {"sourceLabels": ["__meta_kubernetes_pod_label_xpyd_io_deployment"], "targetLabel": "xpyd_deployment"},
    {"sourceLabels": ["__meta_kubernetes_pod_label_xpyd_io_role"], "targetLabel": "xpyd_role"},
]
HTTPS_ENDPOINT = {
    "port": "http",
    "path": "/metrics",
    "scheme": "https",
    "interval": "30s",
    "tlsConfig": {
        "ca": {"secret": {"name": "llama-router-tls", "key": "ca.crt"}},
        "serverName": "llama-router.ns1.svc",
    },
    "relabelings": RELABEL,
}


def body(router: dict[str, Any]) -> dict[str, Any]:
    pool = {"replicas": 1, "gpusPerReplica": 8}
    return {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "topology": {"kind": "HGX-B200"},
        "prefill": pool,
        "decode": pool,
        "router": router,
    }


@pytest.mark.parametrize(
    ("router", "endpoint"),
    [
        ({}, None),  # plain HTTP: the chart's PodMonitor scrapes it
        (KEY, None),
        (TLS, HTTPS_ENDPOINT),
        ({**TLS, **KEY}, HTTPS_ENDPOINT),  # /metrics is open: no key in the monitor either way
    ],
)
def test_the_rendered_monitor(router: dict[str, Any], endpoint: dict[str, Any] | None) -> None:
    spec = DisaggregatedDeploymentSpec.model_validate(body(router))
    monitor = routerkit.pod_monitor(OWNER, spec, MONITOR)
    if endpoint is None:
        assert monitor is None
        return
    assert monitor is not None
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    meta = monitor["metadata"]
    assert (meta["name"], meta["namespace"]) == ("llama-router", "ns1")
    assert meta["labels"]["release"] == "kps" and meta["labels"]["xpyd.io/role"] == "router"
    assert meta["ownerReferences"] == [OWNER.ref()]
    assert monitor["spec"]["selector"] == {"matchLabels": {"xpyd.io/deployment": "llama", "xpyd.io/role": "router"}}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ns1"]}
    assert monitor["spec"]["podMetricsEndpoints"] == [endpoint]


def test_the_monitor_selects_the_router_pods_and_their_port() -> None:
    spec = DisaggregatedDeploymentSpec.model_validate(body(TLS))
    monitor = routerkit.pod_monitor(OWNER, spec, MONITOR)
    deployment = routerkit.deployment(OWNER, spec, "img")
    assert monitor is not None
    template = deployment["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https"  # what the chart's drops
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    service = routerkit.service(OWNER, spec)
    assert routerkit.server_name(OWNER) == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"


async def run(kube: FakeKube, config: Config) -> None:
    await Reconciler(kube, config).reconcile(OWNER.namespace, OWNER.name)


@pytest.mark.parametrize(
    ("crd", "monitor", "made"),
    [(True, MONITOR, True), (False, MONITOR, False), (True, None, False)],
)
async def test_the_reconciler_makes_it_where_the_api_is_and_removes_it_with_tls(
    crd: bool, monitor: MonitorSettings | None, made: bool
) -> None:
    kube = FakeKube(body(TLS), b200_nodes())
    kube.pod_monitor_crd = crd
    config = Config(own_image="ghcr.io/xpyd/xpyd:t", router_monitor=monitor)
    await run(kube, config)
    assert (("PodMonitor", "llama-router") in kube.objects) is made
    assert kube.dd is not None
    kube.dd["spec"]["router"] = {}
    kube.writes.clear()
    await run(kube, config)
    assert ("PodMonitor", "llama-router") not in kube.objects
    assert ("delete PodMonitor/llama-router" in kube.writes) is made
