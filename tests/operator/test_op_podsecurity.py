"""Generated pods: Pod Security level per engine and fabric, router hardening, limits, pull secrets everywhere."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes, spec  # type: ignore[import-not-found]
from pss import level, restricted_violations  # type: ignore[import-not-found]

from xpyd_api import labels as L
from xpyd_operator import engine, podneeds, podsecurity, pools, routerkit
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.desired import build_children
from xpyd_operator.placement import Demand, place
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_perf.topology import TOPOLOGIES

IMG = "ghcr.io/xpyd/xpyd:test"
ROOT_POD = {"containers": [{"name": "c", "securityContext": {}}]}


def _drop_all(**ctx: Any) -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, **ctx}


RESTRICTED_POD = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "c", "securityContext": _drop_all()}],
}


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (RESTRICTED_POD, "restricted"),
        (ROOT_POD, "baseline"),
        ({**RESTRICTED_POD, "volumes": [{"name": "m", "hostPath": {"path": "/models"}}]}, "privileged"),
        ({**RESTRICTED_POD, "hostNetwork": True}, "privileged"),
        ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "privileged"),
        ({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}, "privileged"),
        ({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["CHOWN"]}}}]}, "baseline"),
        ({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "privileged"),
        ({**RESTRICTED_POD, "securityContext": {"runAsNonRoot": True}}, "baseline"),  # no seccomp profile
        ({**RESTRICTED_POD, "containers": [{"name": "c", "securityContext": _drop_all(runAsUser=0)}]}, "baseline"),
        ({**RESTRICTED_POD, "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]}, "baseline"),
    ],
)
def test_the_pss_judge_itself(pod: dict[str, Any], want: str) -> None:
    assert level(pod) == want


def _pod(s: Any, role: str = "decode") -> dict[str, Any]:
    return dict(pools.pod_template(PoolBuild(OWNER, s, role, IMG))["spec"])


# The table docs/security.md prints (tests/examples/test_install_docs.py reads it back).
ENGINE_LEVELS = [
    ({"kind": "emulator"}, "restricted", []),
    ({"kind": "vllm"}, "baseline", []),
    ({"kind": "sglang"}, "baseline", []),
    ({"kind": "vllm", "resources": {"rdma/ib": "1"}}, "privileged", ["IPC_LOCK"]),
    ({"kind": "sglang", "resources": {"rdma/roce_gdr": "1"}}, "privileged", ["IPC_LOCK"]),
    ({"kind": "vllm", "resources": {"vpc.amazonaws.com/efa": "4"}}, "privileged", ["IPC_LOCK"]),
    ({"kind": "vllm", "resources": {"nvidia.com/hostdev": "8"}}, "privileged", ["IPC_LOCK"]),
    ({"kind": "emulator", "resources": {"rdma/ib": "1"}}, "privileged", ["IPC_LOCK"]),
]


@pytest.mark.parametrize(("engine_spec", "want", "adds"), ENGINE_LEVELS)
def test_engine_pods_get_least_privilege(engine_spec: dict[str, Any], want: str, adds: list[str]) -> None:
    pod = _pod(spec(engine=engine_spec))
    assert level(pod) == want
    ctx = pod["containers"][0]["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["capabilities"].get("add", []) == adds
    assert "privileged" not in ctx
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    own_image = engine_spec["kind"] == "emulator"
    assert (ctx.get("readOnlyRootFilesystem") is True) is own_image
    assert (pod["securityContext"].get("runAsUser") == podsecurity.RUN_AS) is own_image
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    # Engines that download weights also get their model cache (an emptyDir unless spec.model.cache says).
    assert mounts == ({"/tmp"} if own_image else {"/dev/shm", "/model-cache"})
    volumes = {v["name"]: v for v in pod["volumes"]}
    if own_image:
        assert volumes[podsecurity.TMP_VOLUME]["emptyDir"] == {"sizeLimit": podsecurity.TMP_SIZE}
    else:
        assert volumes[pools.SHM_VOLUME]["emptyDir"]["medium"] == "Memory"
        assert set(volumes[podneeds.CACHE_VOLUME]) == {"name", "emptyDir"}


def test_secret_env_never_puts_the_token_in_the_spec() -> None:
    token = {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    s = spec(engine={"env": [{"name": "HF_TOKEN", "valueFrom": token}, {"name": "A", "value": "1"}]})
    env = {e["name"]: e for e in _pod(s)["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": token}
    assert env["A"] == {"name": "A", "value": "1"}


def test_nvl72_channel_claim_needs_no_privilege() -> None:
    s = spec(topology={"kind": "GB200-NVL72"}, prefill={"replicas": 1, "gpusPerReplica": 4},
             decode={"replicas": 1, "gpusPerReplica": 4}, engine={"kind": "emulator"})  # fmt: skip
    assert s.decode is not None
    pod = pools.pod_template(PoolBuild(OWNER, s, "decode", IMG, clique="uuid.0", compute_domain=True))["spec"]
    assert pod["resourceClaims"]
    assert level(pod) == "restricted"


@pytest.mark.parametrize(
    ("resources", "limits"),
    [
        ({}, {L.GPU_RESOURCE: "8"}),
        ({"cpu": "16", "memory": "200Gi", "ephemeral-storage": "1Ti"}, {L.GPU_RESOURCE: "8"}),
        ({"rdma/ib": "1"}, {L.GPU_RESOURCE: "8", "rdma/ib": "1"}),
        ({"vpc.amazonaws.com/efa": "4", "memory": "1Ti"}, {L.GPU_RESOURCE: "8", "vpc.amazonaws.com/efa": "4"}),
        ({"hugepages-2Mi": "4Gi"}, {L.GPU_RESOURCE: "8", "hugepages-2Mi": "4Gi"}),
        ({"example.kubernetes.io/native": "1"}, {L.GPU_RESOURCE: "8"}),
    ],
)
def test_extended_resources_get_limits_equal_to_requests(resources: dict[str, str], limits: dict[str, str]) -> None:
    s = spec(engine={"resources": resources})
    assert s.decode is not None
    out = engine.resources(s, s.decode)
    assert out["limits"] == limits
    assert out["requests"] == {**resources, L.GPU_RESOURCE: "8"}


@pytest.mark.parametrize(
    ("names", "caps"),
    [
        ([], []),
        (["cpu", "memory", L.GPU_RESOURCE], []),
        (["rdma/ib"], ["IPC_LOCK"]),
        (["rdma/hca", "vpc.amazonaws.com/efa"], ["IPC_LOCK"]),
        (["rdmaish/thing", "nvidia.com/hostdev-extra"], []),
    ],
)
def test_fabric_capabilities(names: list[str], caps: list[str]) -> None:
    assert podsecurity.fabric_capabilities(names) == caps


def _router(replicas: int = 2) -> dict[str, Any]:
    return routerkit.deployment(OWNER, spec(router={"replicas": replicas}), IMG)


def test_router_runs_restricted_with_limits_and_http_probes() -> None:
    pod = _router()["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert {v["name"] for v in pod["volumes"]} == {podsecurity.TMP_VOLUME}
    assert pod["securityContext"]["runAsUser"] == podsecurity.RUN_AS
    resources = container["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # Liveness must not follow worker health (/health is 503 while no decode worker is ready).
    assert container["livenessProbe"]["httpGet"]["path"] != "/health"
    assert container["livenessProbe"]["httpGet"]["port"] == "http"


def test_router_spreads_over_nodes() -> None:
    pod = _router()["spec"]["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == L.HOSTNAME
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == {L.DEPLOYMENT: "llama", L.ROLE: "router"}


@pytest.mark.parametrize(("replicas", "budget"), [(0, False), (1, False), (2, True), (5, True)])
def test_router_disruption_budget_only_with_more_than_one(replicas: int, budget: bool) -> None:
    pdb = routerkit.disruption_budget(OWNER, spec(router={"replicas": replicas}))
    assert (pdb is not None) is budget
    if pdb is not None:
        assert pdb["metadata"]["name"] == "llama-router"
        mine = {L.DEPLOYMENT: "llama", L.ROLE: "router"}
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": mine}}


def _children(operator_wide: tuple[str, ...], **overrides: Any) -> list[dict[str, Any]]:
    s = spec(**overrides)
    demands = [Demand(role, p.replicas or 1, p.gpus_per_replica, p.tp) for role, p in s.pools().items()]
    return build_children(OWNER, s, place(TOPOLOGIES["HGX-B200"], demands), False, IMG, IMG, operator_wide)


@pytest.mark.parametrize(
    ("operator_wide", "own", "want"),
    [
        ((), [], None),
        (("regcred",), [], ["regcred"]),
        ((), [{"name": "team-ngc"}], ["team-ngc"]),
        (("regcred", "b"), [{"name": "b"}, {"name": "team-ngc"}], ["regcred", "b", "team-ngc"]),
    ],
)
def test_pull_secrets_reach_every_pod(operator_wide: tuple[str, ...], own: list[dict[str, str]], want: Any) -> None:
    children = _children(operator_wide, imagePullSecrets=own, router={"replicas": 2})
    templates = [c for c in children if "template" in c.get("spec", {})]
    assert sorted(c["kind"] for c in templates) == ["Deployment", "StatefulSet", "StatefulSet"]
    for child in templates:
        got = child["spec"]["template"]["spec"].get("imagePullSecrets")
        assert got == (None if want is None else [{"name": n} for n in want]), child["metadata"]["name"]


@pytest.mark.parametrize(("replicas", "kinds"), [(1, 0), (2, 1)])
def test_children_include_the_router_budget(replicas: int, kinds: int) -> None:
    children = _children((), router={"replicas": replicas})
    names = [c["metadata"]["name"] for c in children if c["kind"] == "PodDisruptionBudget"]
    assert names.count("llama-router") == kinds


async def test_reconciler_passes_the_operator_pull_secrets() -> None:
    pool = {"replicas": 1, "gpusPerReplica": 2}
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "prefill": pool, "decode": pool}
    kube = FakeKube(body, b200_nodes())
    await Reconciler(kube, Config(own_image=IMG, image_pull_secrets=("regcred",))).reconcile("ns1", "llama")
    pods = [o["spec"]["template"]["spec"] for o in kube.objects.values() if "template" in o.get("spec", {})]
    assert len(pods) == 3
    assert all(p["imagePullSecrets"] == [{"name": "regcred"}] for p in pods)


@pytest.mark.parametrize(
    ("env", "argv", "want"),
    [
        ("", [], []),
        ("a,b", [], ["a", "b"]),
        ("", ["--image-pull-secret", "x", "--image-pull-secret", "y"], ["x", "y"]),
        ("a", ["--image-pull-secret", "x"], ["a", "x"]),
    ],
)
def test_operator_flag_and_env(monkeypatch: pytest.MonkeyPatch, env: str, argv: list[str], want: list[str]) -> None:
    from xpyd_operator.cli import _parser

    monkeypatch.setenv("XPYD_IMAGE_PULL_SECRETS", env)
    assert _parser().parse_args(argv).image_pull_secret == want


async def test_router_budget_goes_when_one_router_is_left() -> None:
    pool = {"replicas": 1, "gpusPerReplica": 2}
    body = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "prefill": pool, "decode": pool}
    kube = FakeKube({**body, "router": {"replicas": 2}}, b200_nodes())
    reconciler = Reconciler(kube, Config(own_image=IMG))
    await reconciler.reconcile("ns1", "llama")
    assert ("PodDisruptionBudget", "llama-router") in kube.objects
    assert kube.dd is not None
    kube.dd["spec"]["router"] = {"replicas": 1}
    await reconciler.reconcile("ns1", "llama")
    assert ("PodDisruptionBudget", "llama-router") not in kube.objects
    assert "delete PodDisruptionBudget/llama-router" in kube.writes
