"""The chart's operator.defaultNetwork reaches the operator as XPYD_DEFAULT_NETWORK, which it can parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_api import fabrics
from xpyd_api.podmodels import NetworkSpec
from xpyd_chart.helm import CHART, KUBE_VERSION, one, run, template

pytestmark = pytest.mark.usefixtures("helm")
SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def _env(values: dict[str, str]) -> dict[str, Any]:
    container = one(template(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "profile"),
    [
        ({}, None),
        ({"operator.defaultNetwork.profile": "InfiniBand"}, "InfiniBand"),
        ({"operator.defaultNetwork.profile": "RoCE",
          "operator.defaultNetwork.annotations.k8s\\.v1\\.cni\\.cncf\\.io/networks": "rdma-net"}, "RoCE"),
    ],
)  # fmt: skip
def test_default_network_reaches_the_operator(values: dict[str, str], profile: str | None) -> None:
    text = _env(values).get("XPYD_DEFAULT_NETWORK")
    parsed = NetworkSpec.parse(text or "")
    assert (parsed.profile if parsed else None) == profile
    if profile == "RoCE":
        assert parsed is not None and parsed.annotations == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}


def test_schema_knows_the_profiles_the_api_knows() -> None:
    network = SCHEMA["properties"]["operator"]["properties"]["defaultNetwork"]
    assert network["properties"]["profile"]["enum"] == list(fabrics.PROFILES)
    assert set(network["properties"]) == {"profile", *(f.alias for f in NetworkSpec.model_fields.values()
                                                        if f.alias and f.alias != "profile")}  # fmt: skip


def test_schema_refuses_an_unknown_profile() -> None:
    args = ["template", "x", str(CHART), "--kube-version", KUBE_VERSION, "--set", "operator.defaultNetwork.profile=IB"]
    result = run(*args)
    assert result.returncode != 0
    assert "defaultNetwork" in result.stderr
