"""Pod Security admission on a real API server: the router runs in a namespace that enforces `restricted`,
and every generated pod is admitted at exactly the level docs/security.md states."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.core.exceptions import ApiError
from lightkube.resources.policy_v1 import PodDisruptionBudget

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import pools, routerkit
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.meta import Owner

from .kube import is_local_cluster, kubectl
from .operator_fixtures import *  # noqa: F403  (fixtures: op_kube)
from .operator_fixtures import DD, Kube, OperatorProcess, dd_manifest, pods_of, role_of, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LEVELS = ("restricted", "baseline", "privileged")  # strictest first
ENFORCE = "pod-security.kubernetes.io/enforce"
EMULATED = {"engine": {"kind": "emulator"}}


def _label(kube: Kube, prefix: str, level: str) -> str:
    name = kube.create_namespace(prefix)
    kubectl("label", "namespace", name, f"{ENFORCE}={level}", f"{ENFORCE}-version=latest", "--overwrite")
    return name


@pytest.fixture(scope="module")
def restricted(op_kube: Kube) -> Iterator[str]:
    name = _label(op_kube, "xpyd-psa", "restricted")
    yield name
    op_kube.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(restricted: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator-psa") / "operator.log"
    proc = OperatorProcess([restricted], log).start()
    yield proc
    proc.stop()


@pytest.fixture
def deploy(op_kube: Kube, restricted: str, operator: OperatorProcess) -> Iterator[Any]:
    made: list[str] = []

    def apply(name: str, **spec: Any) -> dict[str, Any]:
        made.append(name)
        return op_kube.apply_dd(dd_manifest(name, restricted, **spec))

    yield apply
    for name in made:
        with contextlib.suppress(ApiError):
            op_kube.client.delete(DD, name, namespace=restricted)


def _refusals(namespace: str, deployment: str) -> list[str]:
    """FailedCreate events of the deployment's pods that PodSecurity admission refused."""
    events = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    mine = f'pods "{deployment}-'
    return [
        e["message"]
        for e in events
        if e.get("reason") == "FailedCreate" and "PodSecurity" in e["message"] and mine in e["message"]
    ]


def test_router_and_emulated_workers_run_under_restricted(
    deploy: Any, op_kube: Kube, restricted: str, operator: OperatorProcess
) -> None:
    deploy("psa", router={"replicas": 2}, **EMULATED)

    def ready() -> dict[str, Any] | None:
        cond = op_kube.condition(restricted, "psa", "Ready")
        return cond if cond and cond["status"] == "True" else None

    try:
        wait_for(ready, 180, interval=1, what="Ready=True in a restricted namespace")
    except AssertionError:
        raise AssertionError(f"refused: {_refusals(restricted, 'psa')}\noperator:\n{operator.log_tail()}") from None
    assert _refusals(restricted, "psa") == []
    routers = [p for p in pods_of(op_kube, restricted, "psa") if role_of(p) == "router"]
    assert len(routers) == 2
    for pod in routers:
        assert pod.spec.securityContext.runAsNonRoot is True
        assert pod.spec.containers[0].securityContext.readOnlyRootFilesystem is True
    assert op_kube.get(PodDisruptionBudget, restricted, "psa-router") is not None
    if is_local_cluster():  # pod IPs are reachable from the test only on the local (loopback) cluster
        body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello", "max_tokens": 4}
        reply = httpx.post(f"http://{routers[0].status.podIP}:8000/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200, reply.text

        # The two replicas find each other in the pod watch and pass each other their routes without an
        # API key: each polls from its own pod IP, which the other knows as a peer's. A route is passed
        # on once the replica knows a peer, so each probe routes another prompt through the first one.
        long = body | {"prompt": "Route me where my prefix is cached. " * 64}  # whole KV blocks to pass on

        def learnt() -> str | None:
            httpx.post(f"http://{routers[0].status.podIP}:8000/v1/completions", json=long, timeout=30)
            text = httpx.get(f"http://{routers[1].status.podIP}:8000/metrics", timeout=10).text
            lines = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if "_peer" in line}
            flowing = lines.get("xpyd_router_peers_sharing_routes") == "1.0"
            return text if flowing and float(lines.get("xpyd_router_peer_routes_total", "0")) >= 1 else None

        wait_for(learnt, 60, interval=1, what="the second router replica recording the first one's route")


def test_router_runs_while_root_engines_are_refused(deploy: Any, op_kube: Kube, restricted: str) -> None:
    """vLLM runs as root: `restricted` refuses its pods (FailedCreate, as troubleshooting.md says) and
    still admits the router, which waits unready for a decode worker."""
    deploy("rootful")

    def router_running() -> list[Any] | None:
        pods = [p for p in pods_of(op_kube, restricted, "rootful") if role_of(p) == "router"]
        return pods if pods and all(p.status.phase == "Running" for p in pods) else None

    wait_for(router_running, 120, what="the router pod running")
    refused = wait_for(lambda: _refusals(restricted, "rootful"), 60, what="FailedCreate events")
    assert any('violates PodSecurity "restricted:latest"' in m for m in refused)
    assert not [p for p in pods_of(op_kube, restricted, "rootful") if role_of(p) in ("prefill", "decode")]


@pytest.fixture(scope="module")
def level_namespaces(op_kube: Kube) -> Iterator[dict[str, str]]:
    names = {level: _label(op_kube, f"xpyd-{level[:4]}", level) for level in LEVELS}
    yield names
    for name in names.values():
        op_kube.delete_namespace(name)


OWNER = Owner("psa", "unused", "uid-psa")
IMAGE = "ghcr.io/xpyd/xpyd:e2e"


def _engine_pod(engine: dict[str, Any]) -> dict[str, Any]:
    pool = {"replicas": 1, "gpusPerReplica": 2}
    spec = DisaggregatedDeploymentSpec.model_validate(
        {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": engine, "prefill": pool, "decode": pool}
    )
    assert spec.decode is not None
    return pools.pod_template(PoolBuild(OWNER, spec, "decode", IMAGE))


def _router_pod() -> dict[str, Any]:
    spec = DisaggregatedDeploymentSpec.model_validate({"model": {"name": "m"}, "prefill": {}, "decode": {}})
    template = routerkit.deployment(OWNER, spec, IMAGE)["spec"]["template"]
    del template["spec"]["serviceAccountName"]  # admission would look the account up; PSS does not care
    return dict(template)


# What docs/security.md states (tests/operator/test_op_security_docs.py holds the builders to it).
DOCUMENTED = [
    ("router", _router_pod, "restricted"),
    ("emulator", lambda: _engine_pod({"kind": "emulator"}), "restricted"),
    ("vllm", lambda: _engine_pod({"kind": "vllm"}), "baseline"),
    ("sglang", lambda: _engine_pod({"kind": "sglang"}), "baseline"),
    ("vllm+rdma", lambda: _engine_pod({"kind": "vllm", "resources": {"rdma/ib": "1"}}), "privileged"),
]


@pytest.mark.parametrize(("name", "build", "level"), DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_admitted_exactly_at_the_documented_level(
    level_namespaces: dict[str, str], name: str, build: Any, level: str, tmp_path: Path
) -> None:
    template = build()
    meta = {**template["metadata"], "name": f"dry-{name.replace('+', '-')}"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    for ns_level, namespace in level_namespaces.items():
        result = kubectl("create", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
        allowed = LEVELS.index(level) <= LEVELS.index(ns_level)
        assert (result.returncode == 0) is allowed, f"{name} in a {ns_level} namespace: {result.stderr}"
        if not allowed:
            assert "violates PodSecurity" in result.stderr
