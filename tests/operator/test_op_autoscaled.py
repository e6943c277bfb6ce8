"""Autoscaled pools are sized from status.autoscaler, clamped into the spec's bounds."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator.desired import autoscaled


def spec(enabled: bool = True, prefill_bounds: tuple[int, int] | None = (1, 8)) -> DisaggregatedDeploymentSpec:
    prefill: dict[str, Any] = {"replicas": 2, "gpusPerReplica": 8}
    if prefill_bounds is not None:
        prefill["autoscaling"] = {"minReplicas": prefill_bounds[0], "maxReplicas": prefill_bounds[1]}
    return DisaggregatedDeploymentSpec.model_validate(
        {
            "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
            "topology": {"kind": "HGX-B200"},
            "prefill": prefill,
            "decode": {"replicas": 3, "gpusPerReplica": 8, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}},
            "autoscaling": {"enabled": enabled},
        }
    )


@pytest.mark.parametrize(
    ("enabled", "bounds", "status", "prefill", "decode"),
    [
        (True, (1, 8), {"prefill": {"desired": 5}, "decode": {"desired": 4}}, 5, 4),
        (True, (1, 8), {"prefill": {"desired": 5}, "decode": {"desired": 9}}, 5, 4),  # clamped to max
        (True, (2, 8), {"prefill": {"desired": 1}}, 2, 3),  # clamped to a raised min
        (True, (1, 8), None, 2, 3),  # no decision yet: the starting size
        (True, (1, 8), {"history": [], "prefill": {"reason": "no data"}}, 2, 3),
        (False, (1, 8), {"prefill": {"desired": 5}}, 2, 3),  # autoscaler off: spec wins
        (True, None, {"prefill": {"desired": 5}}, 2, 3),  # pool without bounds is not autoscaled
    ],
)
def test_autoscaled_sizes(
    enabled: bool, bounds: tuple[int, int] | None, status: dict[str, Any] | None, prefill: int, decode: int
) -> None:
    sized = autoscaled(spec(enabled, bounds), status)
    assert sized.prefill is not None
    assert sized.decode is not None
    assert (sized.prefill.replicas, sized.decode.replicas) == (prefill, decode)


def test_crd_schema_uses_openapi_v3_0_exclusive_bounds() -> None:
    from xpyd_api.crdgen import openapi_schema

    def walk(node: object) -> list[object]:
        if isinstance(node, dict):
            found = [node[k] for k in ("exclusiveMinimum", "exclusiveMaximum") if k in node]
            return found + [x for v in node.values() for x in walk(v)]
        if isinstance(node, list):
            return [x for v in node for x in walk(v)]
        return []

    flags = walk(openapi_schema())
    assert flags, "the schema has exclusive bounds (gt=0 fields)"
    assert all(isinstance(f, bool) for f in flags)
