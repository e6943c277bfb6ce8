"""Any model on a real API server: a model outside the catalog, sized from the config.json in a ConfigMap."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap

from xpyd_operator import sizing
from xpyd_operator.render import Options, render_objects

from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube, op_namespace, operator_proc, dd)
from .operator_fixtures import Kube, dd_manifest, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tests" / "perf" / "data" / "model-configs" / "mistralai--Mistral-7B-Instruct-v0.3.json"
MODEL = "mistralai/Mistral-7B-Instruct-v0.3"  # not in the catalog
SPEC: dict[str, Any] = {
    "model": {"name": MODEL, "configMap": {"name": "mistral-config"}},
    "engine": {"kind": "emulator"},
}


def _reason(op_kube: Kube, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    ready = op_kube.condition(ns, name, "Ready")
    return ready if ready and ready["reason"] == reason else None


def test_a_model_outside_the_catalog_is_served_from_its_config_map(dd: Any, op_kube: Kube, op_namespace: str) -> None:
    ns, text = op_namespace, CONFIG.read_text(encoding="utf-8")
    dd("anymodel", **SPEC)  # before its ConfigMap exists: refused, nothing created
    blocked = wait_for(lambda: _reason(op_kube, ns, "anymodel", "ModelConfigInvalid"), 60, what="ModelConfigInvalid")
    assert "create configmap mistral-config" in blocked["message"]
    assert op_kube.get(StatefulSet, ns, "anymodel-decode") is None
    config_map = ConfigMap(metadata=ObjectMeta(name="mistral-config", namespace=ns), data={"config.json": text})
    op_kube.client.create(config_map)
    try:
        # The operator does not watch ConfigMaps: the next resync (5 s here) reads it.
        cond = wait_for(
            lambda: _reason(op_kube, ns, "anymodel", "AllReplicasReady"), 180, interval=1, what="Ready=True"
        )
        assert cond["status"] == "True"
        worthwhile = op_kube.condition(ns, "anymodel", "DisaggregationWorthwhile")
        assert worthwhile is not None and worthwhile["reason"] != "NotModelled", worthwhile
        # What runs is what `xpyd render --model-config` prints: sized from the config's 14.5 GB of weights.
        _, children = render_objects(
            dd_manifest("anymodel", ns, **SPEC), Options(model_config=json.loads(text), model_config_file=str(CONFIG))
        )
        want = next(c for c in children if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "anymodel-decode")
        live = op_kube.get(StatefulSet, ns, "anymodel-decode")
        assert live is not None
        engine = [c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
        rendered = [c for c in want["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
        threshold = engine[0]["startupProbe"]["failureThreshold"]
        assert threshold == rendered[0]["startupProbe"]["failureThreshold"]
        assert threshold < sizing.STARTUP_UNKNOWN_S / sizing.STARTUP_PERIOD_S  # not a model of unknown size
        assert [engine[0].get(k) for k in ("command", "args")] == [rendered[0].get(k) for k in ("command", "args")]
        # A broken edit of the ConfigMap blocks and leaves the running pools alone.
        before = live["spec"]["template"]
        op_kube.client.patch(ConfigMap, "mistral-config", {"data": {"config.json": "{"}}, namespace=ns)
        blocked = wait_for(lambda: _reason(op_kube, ns, "anymodel", "ModelConfigInvalid"), 60, what="broken config")
        assert "not JSON" in blocked["message"]
        after = op_kube.get(StatefulSet, ns, "anymodel-decode")
        assert after is not None and after["spec"]["template"] == before
    finally:
        with contextlib.suppress(ApiError):
            op_kube.client.delete(ConfigMap, "mistral-config", namespace=ns)
