"""Any model: the operator sizes a model outside the catalog from the config.json in spec.model.configMap."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes  # type: ignore[import-not-found]

from xpyd_api import conditions as C
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import sizing
from xpyd_operator.desired import with_model_config
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_perf import GPUS, model_from_config, replica_fit

CONFIGS = Path(__file__).parents[1] / "perf" / "data" / "model-configs"
GEMMA = (CONFIGS / "google--gemma-2-9b-it.json").read_text(encoding="utf-8")
LLAMA_70B = (CONFIGS / "meta-llama--Llama-3.1-70B-Instruct.json").read_text(encoding="utf-8")
POOL = {"replicas": 1, "gpusPerReplica": 1}
CONFIG = Config(own_image="ghcr.io/xpyd/xpyd:t")


def body(model: dict[str, Any] | None = None, **pools: Any) -> dict[str, Any]:
    return {
        "model": model or {"name": "google/gemma-2-9b-it", "configMap": {"name": "gemma-config"}},
        "topology": {"kind": "HGX-B200"},
        "prefill": pools.get("prefill", POOL),
        "decode": pools.get("decode", POOL),
    }


def with_map(spec: dict[str, Any], data: dict[str, str] | None = None) -> FakeKube:
    kube = FakeKube(spec, b200_nodes())
    kube.config_maps["gemma-config"] = {"config.json": GEMMA} if data is None else data
    return kube


async def run(kube: FakeKube) -> list[str]:
    kube.writes.clear()
    await Reconciler(kube, CONFIG).reconcile(OWNER.namespace, OWNER.name)
    return list(kube.writes)


def condition(kube: FakeKube, kind: str = C.READY) -> dict[str, Any]:
    assert kube.dd is not None
    found: dict[str, Any] = next(c for c in kube.dd["status"]["conditions"] if c["type"] == kind)
    return found


def engine(kube: FakeKube, role: str) -> dict[str, Any]:
    pod = kube.objects[("StatefulSet", f"llama-{role}")]["spec"]["template"]["spec"]
    found: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "engine")
    return found


def _spec() -> DisaggregatedDeploymentSpec:
    return DisaggregatedDeploymentSpec.model_validate(body())


async def test_a_model_outside_the_catalog_is_sized_from_its_config_map() -> None:
    kube = with_map(body())
    await run(kube)
    assert ("StatefulSet", "llama-decode") in kube.objects
    assert condition(kube)["reason"] == "ReplicasNotReady"
    weights = model_from_config(json.loads(GEMMA), "google/gemma-2-9b-it").weight_bytes
    # Sized from the weights (18 GB), not the 30 minutes of a model of unknown size.
    threshold = engine(kube, "decode")["startupProbe"]["failureThreshold"]
    assert threshold == math.ceil((sizing.STARTUP_BASE_S + math.ceil(weights / sizing.DOWNLOAD_BYTES_PER_S)) / 10)
    assert threshold < sizing.STARTUP_UNKNOWN_S / sizing.STARTUP_PERIOD_S
    volumes = kube.objects[("StatefulSet", "llama-decode")]["spec"]["template"]["spec"]["volumes"]
    sizes = {v["emptyDir"].get("sizeLimit") for v in volumes if "emptyDir" in v}
    assert f"{math.ceil(weights * sizing.CACHE_HEADROOM / sizing.GI) + sizing.CACHE_EXTRA_GI}Gi" in sizes
    worthwhile = condition(kube, C.DISAGGREGATION_WORTHWHILE)
    assert worthwhile["reason"] != "NotModelled", worthwhile["message"]
    kube.settle()
    await run(kube)
    assert condition(kube)["reason"] == "AllReplicasReady"
    assert await run(kube) == []  # at rest: the ConfigMap's re-read writes nothing


async def test_an_unknown_name_without_a_config_says_how_to_give_one() -> None:
    kube = FakeKube(body({"name": "google/gemma-2-9b-it"}), b200_nodes())
    await run(kube)
    ready = condition(kube)
    assert (ready["status"], ready["reason"]) == ("False", "UnknownModel")
    assert "create configmap" in ready["message"] and "spec.model.configMap" in ready["message"]
    assert not kube.objects


async def test_a_catalog_name_needs_no_config() -> None:
    kube = FakeKube(body({"name": "meta-llama/Llama-3.1-8B-Instruct"}), b200_nodes())
    await run(kube)
    assert condition(kube)["reason"] == "ReplicasNotReady"


@pytest.mark.parametrize(
    ("data", "forbidden", "says"),
    [
        (None, False, "ConfigMap ns1/gemma-config (spec.model.configMap) not found; create it: kubectl -n ns1 "
         "create configmap gemma-config --from-file=config.json="),
        ({"model.json": GEMMA}, False, "ConfigMap ns1/gemma-config has no key 'config.json' (its keys: model.json)"),
        ({"config.json": "{not json"}, False, "ConfigMap ns1/gemma-config key config.json: not JSON"),
        ({"config.json": "[]"}, False, "a config.json is a JSON object, got list"),
        ({"config.json": json.dumps({"hidden_size": 4096})}, False,
         "ConfigMap gemma-config (key config.json): missing key num_hidden_layers"),
        ({"config.json": GEMMA}, True, "cannot read it (configmaps \"gemma-config\" is forbidden)"),
    ],
)  # fmt: skip
async def test_a_bad_config_map_blocks_and_deletes_nothing(
    data: dict[str, str] | None, forbidden: bool, says: str
) -> None:
    kube = with_map(body())
    await run(kube)
    kube.settle()
    await run(kube)
    before = {k: v["metadata"]["annotations"] for k, v in kube.objects.items()}
    if data is None:
        del kube.config_maps["gemma-config"]
    else:
        kube.config_maps["gemma-config"] = data
    kube.forbidden_config_maps = forbidden
    assert await run(kube) == ["status"]
    assert {k: v["metadata"]["annotations"] for k, v in kube.objects.items()} == before
    ready = condition(kube)
    assert (ready["status"], ready["reason"]) == ("False", "ModelConfigInvalid")
    assert says in ready["message"] and ready["message"].endswith("running children left untouched")
    assert ("Warning", "ModelConfigInvalid") in [(t, r) for t, r, _ in kube.events]


async def test_a_config_map_that_appears_later_unblocks() -> None:
    kube = FakeKube(body(), b200_nodes())
    await run(kube)
    assert condition(kube)["reason"] == "ModelConfigInvalid" and not kube.objects
    kube.config_maps["gemma-config"] = {"config.json": GEMMA}
    await run(kube)
    assert condition(kube)["reason"] == "ReplicasNotReady" and ("StatefulSet", "llama-prefill") in kube.objects


async def test_the_fits_check_uses_the_configs_weights_and_kv_cache() -> None:
    model = {"name": "acme/llama-70b-finetune", "configMap": {"name": "gemma-config", "key": "llama.json"}}
    kube = with_map(body(model), {"llama.json": LLAMA_70B})
    await run(kube)
    ready = condition(kube)
    assert ready["reason"] == "ReplicaDoesNotFit"
    shape = model_from_config(json.loads(LLAMA_70B), "acme/llama-70b-finetune")
    assert ready["message"].startswith(f"prefill: {replica_fit(shape, GPUS['B200'], 1).summary()}")
    assert not kube.objects
    assert kube.dd is not None
    kube.dd["spec"]["prefill"] = kube.dd["spec"]["decode"] = {"replicas": 1, "gpusPerReplica": 4}
    await run(kube)
    assert condition(kube)["reason"] == "ReplicasNotReady"


def test_kv_bytes_per_token_overrides_the_config() -> None:
    spec = with_model_config(_spec(), json.loads(GEMMA))
    assert spec.decode is not None
    fit = sizing.replica_fit_of(spec, spec.decode)
    assert fit is not None and fit.kv_bytes_per_token == 42 * 8 * 256 * 2 * 2
    override = spec.model_copy(update={"model": spec.model.model_copy(update={"kv_bytes_per_token": 1000})})
    fit = sizing.replica_fit_of(override, spec.decode)
    assert fit is not None and fit.kv_bytes_per_token == 1000


async def test_the_config_inline_needs_no_config_map() -> None:
    kube = FakeKube(body({"name": "google/gemma-2-9b-it", "config": json.loads(GEMMA)}), b200_nodes())
    await run(kube)
    assert condition(kube)["reason"] == "ReplicasNotReady"
    assert kube.dd is not None
    kube.dd["spec"]["model"]["config"] = {"hidden_size": 1}
    await run(kube)
    ready = condition(kube)
    assert ready["reason"] == "ModelConfigInvalid" and "spec.model.config: missing key" in ready["message"]


async def test_config_and_config_map_together_are_refused() -> None:
    model = {"name": "google/gemma-2-9b-it", "config": json.loads(GEMMA), "configMap": {"name": "gemma-config"}}
    kube = with_map(body(model))
    await run(kube)
    ready = condition(kube)
    assert ready["reason"] == "InvalidSpec" and "config or configMap, not both" in ready["message"]
