"""spec.<pool>.kvOffload: the CPU KV tier rendered per engine release, the pod memory it takes, what is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_api.quantity import bytes_quantity, quantity_bytes
from xpyd_emulator.cmdline import parse_engine_command
from xpyd_operator import engines
from xpyd_operator.render import Options, render_objects
from xpyd_sim import spec as sim_spec

GIB = 1 << 30
VLLM = {v: f"vllm/vllm-openai:v{v}" for v in ("0.11.0", "0.11.1", "0.14.0", "0.23.0", "0.34.0")}
SGLANG = {v: f"lmsysorg/sglang:v{v}" for v in ("0.5.3", "0.5.23")}


def _body(kind: str, image: str | None, offload: dict[str, Any] | None, colocated: bool = False,
          **pool: Any) -> dict[str, Any]:  # fmt: skip
    shape = {"replicas": 1, "gpusPerReplica": 4, **pool}
    if offload is not None:
        shape["kvOffload"] = offload
    engine: dict[str, Any] = {"kind": kind, **({"image": image} if image else {})}
    body: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "topology": {"kind": "HGX-B200"}}
    if colocated:
        return body | {"mode": "Colocated", "engine": engine, "worker": shape}
    decode = {k: v for k, v in shape.items() if k != "kvOffload"}  # the same shape: KV hands over
    return body | {"engine": engine, "prefill": shape, "decode": decode}


def _argv(body: dict[str, Any], role: str) -> list[str]:
    spec = DisaggregatedDeploymentSpec.model_validate(body)
    pool = spec.pools()[role]
    return engines.renderer(spec.engine.kind).argv(spec, role, pool, engines.profile_of(spec))


def _after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize(
    ("image", "dp", "size", "backend"),
    [
        (VLLM["0.14.0"], 1, "64", "native"),
        (VLLM["0.23.0"], 1, "64", "native"),
        (VLLM["0.34.0"], 1, "64", "native"),
        (VLLM["0.34.0"], 2, "32", "native"),  # one engine per data-parallel rank
        (VLLM["0.34.0"], 1, "64", "lmcache"),
    ],
)
def test_vllm_aggregated_pool_takes_the_flags(image: str, dp: int, size: str, backend: str) -> None:
    offload = {"cpuMemory": "64Gi", "backend": backend}
    pool = {"dataParallelSize": dp, "tensorParallelSize": 4 // dp}
    argv = _argv(_body("vllm", image, offload, colocated=True, **pool), "worker")
    assert (_after(argv, "--kv-offloading-size"), _after(argv, "--kv-offloading-backend")) == (size, backend)
    assert "--kv-transfer-config" not in argv  # the flags make vLLM's own connector; nothing to chain


@pytest.mark.parametrize(
    ("image", "role_kv"),
    [(VLLM["0.14.0"], "kv_both"), (VLLM["0.23.0"], "kv_producer"), (VLLM["0.34.0"], "kv_producer")],
)
def test_vllm_pd_pool_chains_nixl_and_the_offloading_connector(image: str, role_kv: str) -> None:
    argv = _argv(_body("vllm", image, {"cpuMemory": "64Gi"}), "prefill")
    assert "--kv-offloading-size" not in argv  # it would replace the NixlConnector (vllm/config/vllm.py)
    config = json.loads(_after(argv, "--kv-transfer-config") or "{}")
    assert (config["kv_connector"], config["kv_role"]) == ("MultiConnector", role_kv)
    nixl, cpu = config["kv_connector_extra_config"]["connectors"]
    assert (nixl["kv_connector"], nixl["kv_role"]) == ("NixlConnector", role_kv)
    assert cpu == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 64 * GIB},
    }


def test_vllm_pd_pool_with_lmcache_chains_lmcache_sized_per_rank() -> None:
    argv = _argv(_body("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi", "backend": "lmcache"}), "prefill")
    _, cpu = json.loads(_after(argv, "--kv-transfer-config") or "{}")["kv_connector_extra_config"]["connectors"]
    assert cpu["kv_connector"] == "LMCacheConnectorV1"
    assert cpu["kv_connector_extra_config"] == {"lmcache.local_cpu": True, "lmcache.max_local_cpu_size": 16}


def test_a_pool_without_kv_offload_renders_no_tier() -> None:
    argv = _argv(_body("vllm", VLLM["0.34.0"], None), "prefill")
    assert json.loads(_after(argv, "--kv-transfer-config") or "{}")["kv_connector"] == "NixlConnector"
    assert not any("offloading" in w or "hicache" in w or "hierarchical" in w for w in argv)


@pytest.mark.parametrize(("version", "role"), [(v, r) for v in SGLANG for r in ("prefill", "decode")])
def test_sglang_takes_hicache_per_rank_in_gb(version: str, role: str) -> None:
    body = _body("sglang", SGLANG[version], None)
    body[role] = {"replicas": 1, "gpusPerReplica": 4, "kvOffload": {"cpuMemory": "400G"}}
    argv = _argv(body, role)
    assert "--enable-hierarchical-cache" in argv
    assert _after(argv, "--hicache-size") == "100"  # 400 GB over 4 ranks, in SGLang's 1e9-byte GB


def test_sglang_hicache_is_at_least_one_gb_per_rank() -> None:
    argv = _argv(_body("sglang", SGLANG["0.5.23"], {"cpuMemory": "1Gi"}), "prefill")
    assert _after(argv, "--hicache-size") == "1"


@pytest.mark.parametrize("colocated", [False, True])
def test_the_emulator_reads_the_tier_the_operator_renders(colocated: bool) -> None:
    """What the operator renders for an emulated pool with kvOffload, parsed by the emulator itself: the CPU tier's
    bytes, and (a P/D pool's MultiConnector) the handoff connector inside the chain."""
    role = "worker" if colocated else "prefill"
    argv = _argv(_body("emulator", None, {"cpuMemory": "64Gi"}, colocated=colocated), role)
    assert argv[:3] == ["xpyd", "emulate", "--"]
    cfg = parse_engine_command(argv[3:], {})
    assert cfg.kv_offloading_bytes == 64 * GIB
    if colocated:
        assert _after(argv, "--kv-offloading-size") == "64"
    else:
        assert json.loads(_after(argv, "--kv-transfer-config") or "{}")["kv_connector"] == "MultiConnector"
        assert cfg.kv_transfer_config is not None
        assert cfg.kv_transfer_config["kv_connector"] == "NixlConnector"
        assert cfg.kv_transfer_config["kv_role"] == "kv_producer"


@pytest.mark.parametrize(
    ("offload", "message"),
    [
        ({"cpuMemory": "64Gi", "backend": "lmcache"}, "the emulator models vLLM's native offloading only"),
        ({"cpuMemory": "64Gi", "disk": "1Ti"}, "the emulator models a CPU tier only"),
    ],
)
def test_the_emulator_refuses_a_tier_it_does_not_model(offload: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DisaggregatedDeploymentSpec.model_validate(_body("emulator", None, offload))


def _engine_resources(body: dict[str, Any], role: str) -> dict[str, Any]:
    doc = {"apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment", "metadata": {"name": "m"},
           "spec": body}  # fmt: skip
    _, objects = render_objects(doc, Options())
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "LeaderWorkerSet") and obj["metadata"]["name"].endswith(role):
            spec = obj["spec"]
            template = spec.get("template") or spec["leaderWorkerTemplate"]["leaderTemplate"]
            out: dict[str, Any] = template["spec"]["containers"][0]["resources"]
            return out
    raise AssertionError(f"no {role} workload in {[o['metadata']['name'] for o in objects]}")


@pytest.mark.parametrize(
    ("kind", "image", "extra", "pool", "memory"),
    [
        ("vllm", VLLM["0.34.0"], {}, {}, "64Gi"),
        ("vllm", VLLM["0.34.0"], {"memory": "200Gi"}, {}, "264Gi"),  # on top of spec.engine.resources
        ("sglang", SGLANG["0.5.23"], {}, {}, "64Gi"),
        ("vllm", VLLM["0.34.0"], {}, {"gpusPerReplica": 16}, "32Gi"),  # two pods share a replica's tier
        ("emulator", None, {}, {}, "64Gi"),  # the emulator models the tier: reserved as for vLLM
    ],
)
def test_the_pod_memory_request_grows_by_its_share(
    kind: str, image: str | None, extra: dict[str, str], pool: dict[str, Any], memory: str | None
) -> None:
    body = _body(kind, image, {"cpuMemory": "64Gi"}, **pool)
    body["engine"]["resources"] = extra
    resources = _engine_resources(body, "prefill")
    assert resources.get("requests", {}).get("memory") == memory
    assert _engine_resources(body, "decode").get("requests", {}).get("memory") == extra.get("memory")


def test_a_patched_memory_limit_that_holds_the_tier_is_accepted() -> None:
    body = _body("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi"})
    body["prefill"]["podTemplatePatch"] = {
        "spec": {"containers": [{"name": "engine", "resources": {"limits": {"memory": "512Gi"}}}]}
    }
    assert DisaggregatedDeploymentSpec.model_validate(body).prefill is not None  # 512Gi holds the 64Gi tier


def _refusal(body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as err:
        DisaggregatedDeploymentSpec.model_validate(body)
    return str(err.value)


@pytest.mark.parametrize(
    ("kind", "image", "offload", "message"),
    [
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "0"}, "kvOffload.cpuMemory must be a positive memory quantity"),
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "0Gi"}, "kvOffload.cpuMemory must be a positive"),
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "-1Gi"}, "cpuMemory"),
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "500m"}, "kvOffload.cpuMemory must be a positive"),  # milli-bytes
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi", "backend": "swap"}, "backend"),
        ("vllm", VLLM["0.34.0"], {}, "cpuMemory"),
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi", "disk": "0"}, "kvOffload.disk must be a positive"),
        ("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi", "disk": "1Ti"}, "prefill.kvOffload.disk: vllm 0.23.0"),
        ("vllm", VLLM["0.11.0"], {"cpuMemory": "64Gi"}, "prefill.kvOffload needs vllm 0.14.0 or newer"),
        ("vllm", VLLM["0.11.1"], {"cpuMemory": "64Gi"}, "prefill.kvOffload needs vllm 0.14.0 or newer"),
        ("sglang", SGLANG["0.5.3"], {"cpuMemory": "64Gi", "backend": "lmcache"}, "offloads with its HiCache"),
    ],
)
def test_nonsense_is_refused_naming_the_field(kind: str, image: str, offload: dict[str, Any], message: str) -> None:
    assert message in _refusal(_body(kind, image, offload))


@pytest.mark.parametrize("where", ["spec", "pool"])
def test_a_patched_memory_limit_below_the_tier_is_refused(where: str) -> None:
    body = _body("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi"})
    patch = {"spec": {"containers": [{"name": "engine", "resources": {"limits": {"memory": "32Gi"}}}]}}
    (body if where == "spec" else body["prefill"])["podTemplatePatch"] = patch
    field = "podTemplatePatch" if where == "spec" else "prefill.podTemplatePatch"
    assert f"{field} limits the engine's memory to 32Gi, below prefill.kvOffload.cpuMemory's 64Gi" in _refusal(body)


@pytest.mark.parametrize(
    ("text", "n"),
    [("64Gi", 64 * GIB), ("500G", 500 * 10**9), ("1.5Ti", 3 << 39), ("1e3", 1000), ("128974848", 128974848),
     ("500m", None), ("Gi", None), ("", None)],
)  # fmt: skip
def test_quantity_bytes(text: str, n: int | None) -> None:
    assert quantity_bytes(text) == n
    if n:
        assert quantity_bytes(bytes_quantity(n)) == n


def test_the_simulator_reads_the_tier_into_its_pool_plan() -> None:
    body = _body("vllm", VLLM["0.34.0"], {"cpuMemory": "64Gi"})
    plans = sim_spec._plans(DisaggregatedDeploymentSpec.model_validate(body))
    assert (plans["prefill"].offload_bytes, plans["decode"].offload_bytes) == (64 * GIB, 0)
