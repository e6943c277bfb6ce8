"""Pure builders: engine command lines, pools, router objects, owner references and hashes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakekube import CLIQUE_A, OWNER, spec  # type: ignore[import-not-found]
from pydantic import ValidationError

from xpyd_api import labels as L
from xpyd_operator import engine, pools, routerkit
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.desired import build_children
from xpyd_operator.meta import manifest_hash, stamp
from xpyd_operator.placement import Demand, place

IMG = "ghcr.io/xpyd/xpyd:test"
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
KV_P = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
KV_D = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
M70 = "meta-llama/Llama-3.1-70B-Instruct"
EV_SGL = '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5657","topic":"kv-events"}'
EV = '{"enable_kv_cache_events":true,' + EV_SGL[1:]  # SGLang's KVEventsConfig has no enable key


VLLM = ["vllm", "serve", M70, "--port", "8000"]
SGL = ["python3", "-m", "sglang.launch_server", "--model-path", M70, "--host", "0.0.0.0", "--port", "8000"]
V11, S53 = "vllm/vllm-openai:v0.11.0", "lmsysorg/sglang:v0.5.3"  # the oldest releases served


@pytest.mark.parametrize(
    ("overrides", "role", "argv"),
    [
        # today's vLLM: the NixlConnector's producer on prefill, consumer on decode (kv_both is deprecated)
        ({}, "prefill", [*VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config", KV_P, "--kv-events-config", EV]),
        ({}, "decode", [*VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config", KV_D, "--kv-events-config", EV]),
        ({"engine": {"image": V11}}, "decode",
         [*VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config", KV, "--kv-events-config", EV]),
        ({"engine": {"image": "my.registry/vllm:prod", "version": "0.11.0"}}, "prefill",
         [*VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config", KV, "--kv-events-config", EV]),
        (
            {"mode": "Colocated", "prefill": None, "decode": None, "worker": {"gpusPerReplica": 4}},
            "worker",
            [*VLLM, "--tensor-parallel-size", "4", "--enable-chunked-prefill", "--kv-events-config", EV],
        ),
        (  # SGLang serves /metrics only with --enable-metrics: the autoscaler, drain and dashboards read it
            {"engine": {"kind": "sglang"}},
            "decode",
            [*SGL, "--enable-metrics", "--tp-size", "8", "--disaggregation-mode", "decode",
             "--disaggregation-transfer-backend", "nixl", "--kv-events-config", EV_SGL],
        ),
        (
            {"engine": {"kind": "sglang", "kvConnector": "MooncakeConnector"}},
            "prefill",
            [*SGL, "--enable-metrics", "--tp-size", "8", "--disaggregation-mode", "prefill",
             "--disaggregation-transfer-backend", "mooncake", "--disaggregation-bootstrap-port", "8998",
             "--kv-events-config", EV_SGL],
        ),
        (
            {"engine": {"kind": "emulator", "args": ["--max-model-len", "8192"]}},
            "decode",
            ["xpyd", "emulate", "--", *VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config", KV_D,
             "--kv-events-config", EV, "--max-model-len", "8192"],
        ),
        (
            {"decode": {"replicas": 1, "gpusPerReplica": 8, "tensorParallelSize": 4, "dataParallelSize": 2,
                        "args": ["--x"]}},
            "decode",
            [*VLLM, "--tensor-parallel-size", "4", "--data-parallel-size", "2", "--kv-transfer-config", KV_D,
             "--kv-events-config", EV, "--x"],
        ),
        (  # wide expert parallel (llm-d wide-ep-lws): one replica = 8 data-parallel ranks of TP1, DeepEP by role
            {"decode": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}},
            "decode",
            [*VLLM, "--tensor-parallel-size", "1", "--data-parallel-size", "8", "--enable-expert-parallel",
             "--all2all-backend", "deepep_low_latency", "--kv-transfer-config", KV_D, "--kv-events-config", EV],
        ),
        (  # vLLM v0.11 takes the kernel from VLLM_ALL2ALL_BACKEND (the environment), not a flag
            {"engine": {"image": V11},
             "prefill": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}},
            "prefill",
            [*VLLM, "--tensor-parallel-size", "1", "--data-parallel-size", "8", "--enable-expert-parallel",
             "--kv-transfer-config", KV, "--kv-events-config", EV],
        ),
        (  # SGLang's --tp is the world size; 0.5.23 splits attention by --attn-dp-size, expert parallel by --ep-size
            {"engine": {"kind": "sglang"},
             "decode": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}},
            "decode",
            [*SGL, "--enable-metrics", "--tp-size", "8", "--attn-dp-size", "8", "--ep-size", "8",
             "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
             "--kv-events-config", EV_SGL],
        ),
        (  # SGLang 0.5.3: --dp-size N --enable-dp-attention (0.5.23 deprecates it)
            {"engine": {"kind": "sglang", "image": S53},
             "decode": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}},
            "decode",
            [*SGL, "--enable-metrics", "--collect-tokens-histogram", "--tp-size", "8", "--dp-size", "8",
             "--enable-dp-attention", "--ep-size", "8",
             "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
             "--kv-events-config", EV_SGL],
        ),
        (  # AWS EFA: NIXL moves the KV cache over libfabric; CPU engines keep the KV buffer in host memory
            {"network": {"profile": "AWS-EFA"}, "engine": {"kvTransferConfig": {"kv_buffer_device": "cpu"}}},
            "prefill",
            [*VLLM, "--tensor-parallel-size", "8", "--kv-transfer-config",
             '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu",'
             '"kv_connector_extra_config":{"backends":["LIBFABRIC"]}}',
             "--kv-events-config", EV],
        ),
    ],
)  # fmt: skip
def test_engine_command(overrides: dict[str, Any], role: str, argv: list[str]) -> None:
    body = {k: v for k, v in {**_base(), **overrides}.items() if v is not None}
    s = _spec(body)
    assert engine.command(s, role, s.pools()[role]) == argv


def _base() -> dict[str, Any]:
    return {
        "model": {"name": M70},
        "topology": {"kind": "HGX-B200"},
        "prefill": {"replicas": 2, "gpusPerReplica": 8},
        "decode": {"replicas": 4, "gpusPerReplica": 8},
    }


def _spec(body: dict[str, Any]) -> Any:
    from xpyd_api.models import DisaggregatedDeploymentSpec

    return DisaggregatedDeploymentSpec.model_validate(body)


@pytest.mark.parametrize(
    ("kind", "image"),
    [("vllm", "vllm/vllm-openai:v0.34.0"), ("sglang", "lmsysorg/sglang:v0.5.23"), ("emulator", IMG)],
)
def test_default_images(kind: str, image: str) -> None:
    assert engine.image_for(spec(engine={"kind": kind}), IMG) == image
    assert engine.image_for(spec(engine={"kind": kind, "image": "mine:1"}), IMG) == "mine:1"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("topology", "clique", "domain"),
    [
        ("HGX-B200", None, {"fieldRef": {"fieldPath": "spec.nodeName"}}),
        ("GB200-NVL72", CLIQUE_A, CLIQUE_A),
        ("GB200-NVL72", None, None),
        ("Any", None, None),
    ],
)
def test_engine_env(topology: str, clique: str | None, domain: Any) -> None:
    s = spec(topology={"kind": topology}, engine={"env": [{"name": "HF_TOKEN", "value": "x"}]})
    assert s.prefill is not None
    env = _env(engine.container(PoolBuild(OWNER, s, "prefill", IMG, clique=clique)))
    assert env[L.ENV_NIXL_HOST] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[L.ENV_NODE_NAME] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env.get(L.ENV_NVLINK_DOMAIN) == domain
    assert env["HF_TOKEN"] == "x"
    assert env[L.ENV_ROLE] == "prefill"


def test_engine_container_probes_gpus_and_drain() -> None:
    s = spec(engine={"drainSeconds": 300, "resources": {"memory": "200Gi"}})
    assert s.decode is not None
    c = engine.container(PoolBuild(OWNER, s, "decode", IMG))
    assert c["resources"] == {
        "requests": {"memory": "200Gi", L.GPU_RESOURCE: "8"},
        "limits": {L.GPU_RESOURCE: "8"},
    }
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["timeoutSeconds"] == c["livenessProbe"]["timeoutSeconds"] == 5  # load is not death
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "vllm:num_requests_running" in c["lifecycle"]["preStop"]["exec"]["command"][2]
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [
        ("http", 8000), ("kv-side", 5600), ("kv-events", 5557), ("kv-replay", 5657),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "clique", "cd"),
    [(3, None, False), (None, None, False), (2, CLIQUE_A, False), (2, CLIQUE_A, True)],
)
def test_statefulset(replicas: int | None, clique: str | None, cd: bool) -> None:
    prefill: dict[str, Any] = {"gpusPerReplica": 4}
    if replicas is not None:
        prefill["replicas"] = replicas
    s = spec(topology={"kind": "GB200-NVL72"}, prefill=prefill, decode={"replicas": 1, "gpusPerReplica": 4})
    assert s.prefill is not None
    sel = {L.GPU_PRODUCT: "NVIDIA-GB200"}  # as GPU Feature Discovery labels a GB200 tray
    sts = pools.statefulset(PoolBuild(OWNER, s, "prefill", IMG, sel, clique, cd))
    body, pod = sts["spec"], sts["spec"]["template"]["spec"]
    assert sts["metadata"]["name"] == "llama-prefill"
    assert body["serviceName"] == "llama-prefill"
    assert body["podManagementPolicy"] == "Parallel"
    assert ("replicas" in body) is (replicas is not None)
    assert body.get("replicas") == replicas
    assert body["selector"]["matchLabels"] == {L.DEPLOYMENT: "llama", L.ROLE: "prefill"}
    assert pod["nodeSelector"] == sel
    assert pod["terminationGracePeriodSeconds"] >= s.engine.drain_seconds
    template_labels = body["template"]["metadata"]["labels"]
    assert template_labels.get(L.NVLINK_DOMAIN_LABEL) == clique
    if clique:
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [clique]
    else:
        assert "affinity" not in pod
    assert ("resourceClaims" in pod) is cd
    if cd:
        assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == "llama-imex-channel"
        assert pod["containers"][0]["resources"]["claims"] == [{"name": pools.CHANNEL_CLAIM}]


@pytest.mark.parametrize(("role", "ports"), [("prefill", [8000, 5600]), ("worker", [8000])])
def test_headless_service_and_pdb(role: str, ports: list[int]) -> None:
    svc = pools.headless_service(OWNER, role)
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in svc["spec"]["ports"]] == ports
    pdb = pools.disruption_budget(OWNER, role)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {L.DEPLOYMENT: "llama", L.ROLE: role}},
    }


def test_compute_domain() -> None:
    cd = pools.compute_domain(OWNER, 6)
    assert cd["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert cd["spec"] == {"numNodes": 6, "channel": {"resourceClaimTemplate": {"name": "llama-imex-channel"}}}


@pytest.mark.parametrize(("router", "image"), [({}, IMG), ({"image": "r:2", "replicas": 3}, "r:2")])
def test_router_objects(router: dict[str, Any], image: str) -> None:
    s = spec(router=router)
    dep = routerkit.deployment(OWNER, s, IMG)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == image
    assert c["command"] == [
        "xpyd", "router", "--deployment", "llama", "--namespace", "ns1", "--host", "$(POD_IP)", "--port", "8000",
        "--policy", "kv-aware", "--kv-bytes-per-token", "327680", "--engine", "vllm", "--tokenizer", f"hf:{M70}",
        "--handoff-slow-seconds", "0.081",  # the break-even: Llama-70B's decode stall for 4096 tokens on 8 B200s
    ]  # fmt: skip
    assert _env(c)[L.ENV_ROUTER_POLICY] == "kv-aware"
    assert dep["spec"]["replicas"] == s.router.replicas
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "llama-router"
    rules = routerkit.role(OWNER)["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"pods", "endpointslices"}
    assert {v for rule in rules for v in rule["verbs"]} == {"get", "list", "watch"}
    binding = routerkit.role_binding(OWNER)
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "llama-router", "namespace": "ns1"}
    assert routerkit.service(OWNER)["spec"]["ports"][0]["port"] == 8000


@pytest.mark.parametrize(
    ("mode_body", "kinds"),
    [
        (
            {},
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Service",
                "PodDisruptionBudget",
                "Service",
                "PodDisruptionBudget",
                "StatefulSet",
                "StatefulSet",
                "Deployment",
                "Service",
            ],
        ),
        (
            {"mode": "Colocated", "worker": {"replicas": 2}},
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Service",
                "PodDisruptionBudget",
                "StatefulSet",
                "Deployment",
                "Service",
            ],
        ),
    ],
)
def test_children_are_owned_labelled_and_stamped(mode_body: dict[str, Any], kinds: list[str]) -> None:
    body = _base()
    if mode_body:
        body = {"model": body["model"], "topology": body["topology"], **mode_body}
    s = _spec(body)
    demands = [Demand(role, p.replicas or 1, p.gpus_per_replica, p.tp) for role, p in s.pools().items()]
    children = build_children(OWNER, s, place(s.topology.hardware, demands), False, IMG, IMG)
    assert [c["kind"] for c in children] == kinds
    for c in children:
        assert c["metadata"]["ownerReferences"] == [OWNER.ref()]
        assert c["metadata"]["ownerReferences"][0]["controller"] is True
        assert c["metadata"]["labels"][L.MANAGED_BY] == L.MANAGER
        assert c["metadata"]["annotations"][L.APPLIED_HASH] == manifest_hash(c)


def test_hash_is_stable_and_changes_with_content() -> None:
    a = stamp({"kind": "X", "metadata": {"name": "a"}, "spec": {"v": 1}})
    b = stamp(json.loads(json.dumps(a)))
    c = stamp({"kind": "X", "metadata": {"name": "a"}, "spec": {"v": 2}})
    assert a == b
    assert manifest_hash(a) != manifest_hash(c)


@pytest.mark.parametrize(
    ("engine", "model", "router", "extra", "env"),
    [
        ({"kind": "emulator"}, {}, {}, ["--tokenizer", "emulator"], []),
        ({"kind": "vllm"}, {}, {}, ["--tokenizer", f"hf:{M70}"], ["HF_HOME"]),
        ({"kind": "sglang"}, {"tokenSecret": {"name": "hf", "key": "token"}}, {}, ["--tokenizer", f"hf:{M70}"],
         ["HF_HOME", "HF_TOKEN"]),
        ({"kind": "vllm", "env": [{"name": "HF_ENDPOINT", "value": "http://mirror"}, {"name": "OTHER", "value": "x"}]},
         {}, {"tokenizer": "hf:org/tok@v2"}, ["--tokenizer", "hf:org/tok@v2"], ["HF_HOME", "HF_ENDPOINT"]),
        ({"kind": "vllm"}, {"name": "/models/llama"}, {}, [], []),  # served from a volume the router lacks
        ({"kind": "vllm"}, {"name": "org/a..b"}, {}, [], []),  # not a name the Hub has: byte keys, not a crash
        ({"kind": "vllm"}, {}, {"tokenizer": "/opt/tok"}, ["--tokenizer", "/opt/tok"], []),
        ({"kind": "emulator"}, {}, {"tokenizer": "none"}, [], []),
    ],
)  # fmt: skip
def test_router_tokenizer_follows_the_served_model(
    engine: dict[str, Any], model: dict[str, Any], router: dict[str, Any], extra: list[str], env: list[str]
) -> None:
    d = spec(engine=engine, model={"name": M70, **model}, router=router)
    c = routerkit.deployment(OWNER, d, IMG)["spec"]["template"]["spec"]["containers"][0]
    after = c["command"][c["command"].index("--engine") + 2 :]
    if "--handoff-slow-seconds" in after:  # the break-even, after the tokenizer (test_op_router_breakeven.py)
        at = after.index("--handoff-slow-seconds")
        after = after[:at] + after[at + 2 :]
    assert after == extra
    hub = [e["name"] for e in c["env"] if e["name"].startswith("HF_")]
    assert hub == env


@pytest.mark.parametrize(
    "bad", ["hf:", "hf:a b", "relative/path", "Auto", "hf:org/name@", "x" * 301, "hf:org/.x", "/opt/tok/..", "hf:a/b/c"]
)
def test_router_tokenizer_rejects_what_the_router_cannot_load(bad: str) -> None:
    with pytest.raises(ValidationError, match="tokenizer"):
        spec(router={"tokenizer": bad})
