"""spec.slo: the SLO policy's targets validate with a message that names the field, in Python and in the CRD."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from xpyd_api import crdgen
from xpyd_api.models import DisaggregatedDeploymentSpec

BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
}


def with_slo(**slo: Any) -> dict[str, Any]:
    return {**BASE, "slo": {"ttftSeconds": 1.0, "itlSeconds": 0.05, **slo}}


def test_slo_is_optional_and_defaults_its_percentile_and_goal() -> None:
    assert DisaggregatedDeploymentSpec.model_validate(BASE).slo is None
    slo = DisaggregatedDeploymentSpec.model_validate(with_slo()).slo
    assert slo is not None
    assert (slo.ttft_seconds, slo.itl_seconds, slo.percentile, slo.attainment) == (1.0, 0.05, 95, 0.99)


@pytest.mark.parametrize(
    ("slo", "needle"),
    [
        ({"percentile": 80}, "slo.percentile must be 90, 95 or 99, got 80"),
        ({"percentile": 100}, "slo.percentile must be 90, 95 or 99"),
        ({"ttftSeconds": -1}, "ttftSeconds"),
        ({"ttftSeconds": 0}, "greater than 0"),
        ({"itlSeconds": -0.01}, "itlSeconds"),
        ({"attainment": 1.5}, "attainment"),
        ({"attainment": 0}, "attainment"),
        ({"ttftSecond": 1}, "ttftSecond"),  # a typo is refused, not ignored
    ],
)
def test_bad_slo_is_refused_naming_the_field(slo: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        DisaggregatedDeploymentSpec.model_validate(with_slo(**slo))


def test_missing_targets_are_refused() -> None:
    with pytest.raises(ValidationError, match="itlSeconds"):
        DisaggregatedDeploymentSpec.model_validate({**BASE, "slo": {"ttftSeconds": 1.0}})


def test_crd_bounds_the_slo() -> None:
    spec = yaml.safe_load(crdgen.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    slo = spec["properties"]["slo"]
    assert set(slo["required"]) == {"ttftSeconds", "itlSeconds"}
    rules = slo["x-kubernetes-validations"]
    assert rules[0]["rule"] == "self.percentile in [90, 95, 99]"
    assert rules[0]["message"] == "slo.percentile must be 90, 95 or 99"
    props = slo["properties"]
    assert (props["ttftSeconds"]["minimum"], props["ttftSeconds"]["exclusiveMinimum"]) == (0, True)
    assert props["attainment"]["maximum"] == 1
