"""Which pods are workers: Ready, not terminating, with a role; URL and NVLink domain from the pod."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube.models.core_v1 import Container, ContainerPort, PodCondition, PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from xpyd_api import labels
from xpyd_router.discovery import pod_worker, watch_deployment, workers_of
from xpyd_router.pool import WorkerSpec


def pod(
    role: str = "prefill",
    ready: str = "True",
    ip: str | None = "127.0.0.9",
    node: str | None = "node-1",
    ports: list[ContainerPort] | None = None,
    deleting: bool = False,
    extra: dict[str, str] | None = None,
) -> Pod:
    meta: dict[str, Any] = {
        "name": f"p-{role}",
        "labels": {labels.DEPLOYMENT: "d", labels.ROLE: role, **(extra or {})},
    }
    if deleting:
        meta["deletionTimestamp"] = datetime(2026, 1, 1, tzinfo=UTC)
    return Pod(
        metadata=ObjectMeta(**meta),
        spec=PodSpec(containers=[Container(name="vllm", ports=ports)], nodeName=node),
        status=PodStatus(podIP=ip, conditions=[PodCondition(type="Ready", status=ready)]),
    )


@pytest.mark.parametrize(
    ("the_pod", "want"),
    [
        (pod(), WorkerSpec("http://127.0.0.9:8000", "prefill", "node-1")),
        (
            pod(
                "decode",
                ports=[ContainerPort(containerPort=9000, name="metrics"), ContainerPort(8100, name="http")],
            ),
            WorkerSpec("http://127.0.0.9:8100", "decode", "node-1"),
        ),
        (
            pod("worker", extra={labels.NVLINK_DOMAIN_LABEL: "clique-7"}),
            WorkerSpec("http://127.0.0.9:8000", "worker", "clique-7"),
        ),
        (pod(node=None), WorkerSpec("http://127.0.0.9:8000", "prefill", "")),
        (
            pod("decode", extra={labels.ENGINE_REV: "0a1b2c3d4e"}),
            WorkerSpec("http://127.0.0.9:8000", "decode", "node-1", "0a1b2c3d4e"),
        ),
        (  # the engine's KV events: the router subscribes to the ports the operator names
            pod("decode", ports=[ContainerPort(5557, name="kv-events"), ContainerPort(5657, name="kv-replay")]),
            WorkerSpec("http://127.0.0.9:8000", "decode", "node-1", "", "tcp://127.0.0.9:5557", "tcp://127.0.0.9:5657"),
        ),
        (
            pod("decode", ports=[ContainerPort(5557, name="kv-events")]),
            WorkerSpec("http://127.0.0.9:8000", "decode", "node-1", "", "tcp://127.0.0.9:5557"),
        ),
        (pod(ready="False"), None),
        (pod(ip=None), None),
        (pod("router"), None),
        (pod(deleting=True), None),
    ],
)
def test_pod_worker(the_pod: Pod, want: WorkerSpec | None) -> None:
    assert pod_worker(the_pod) == want


def test_workers_of_skips_non_workers() -> None:
    assert workers_of([pod(), pod(ready="False"), pod("decode")]) == [
        WorkerSpec("http://127.0.0.9:8000", "prefill", "node-1"),
        WorkerSpec("http://127.0.0.9:8000", "decode", "node-1"),
    ]


class FakeClient:
    """lightkube's list and watch over a fixed pod list and event script; the watch then stays open."""

    def __init__(self, pods: list[Pod], script: list[tuple[str, Pod]]) -> None:
        self.pods = pods
        self.script = script
        self.idle = asyncio.Event()

    async def list(self, *_: Any, **__: Any) -> AsyncIterator[Pod]:
        for p in self.pods:
            yield p

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, Pod]]:
        for event in self.script:
            yield event
        self.idle.set()
        await asyncio.Event().wait()


def named(p: Pod, name: str, ip: str) -> Pod:
    assert p.metadata is not None
    assert p.status is not None
    p.metadata.name = name
    p.status.podIP = ip
    return p


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"deleting": True}, id="terminating"),
        pytest.param({"ready": "False"}, id="not-ready"),
    ],
)
async def test_a_draining_pod_leaves_the_pool_on_its_first_event(change: dict[str, Any]) -> None:
    """A pod going away stops getting new requests as soon as the API says so, not at deletion."""
    a, b = named(pod("decode"), "a", "127.0.0.1"), named(pod("decode"), "b", "127.0.0.2")
    leaving = named(pod("decode", **change), "b", "127.0.0.2")
    client = FakeClient([a, b], [("MODIFIED", leaving)])
    seen: list[list[str]] = []
    task = asyncio.create_task(
        watch_deployment("d", "ns", lambda ws: seen.append([w.url for w in ws]), client)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(client.idle.wait(), 5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert seen == [["http://127.0.0.1:8000", "http://127.0.0.2:8000"], ["http://127.0.0.1:8000"]]


def _router(ip: str | None, ready: str = "True", deleting: bool = False) -> Pod:
    made = pod("router", ready=ready, ip=ip, deleting=deleting, ports=[ContainerPort(8000, name="http")])
    assert made.metadata is not None
    made.metadata.name = f"router-{ip}"
    return made


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        ([_router("127.0.0.5"), _router("127.0.0.6")], ["http://127.0.0.6:8000"]),  # not itself
        ([_router("127.0.0.7"), _router("127.0.0.6")], ["http://127.0.0.6:8000", "http://127.0.0.7:8000"]),
        ([_router("127.0.0.6", ready="False"), _router("127.0.0.7", deleting=True)], []),
        ([_router(None), pod("prefill", ip="127.0.0.8")], []),  # no IP yet; a worker is no peer
    ],
)
def test_router_peers_are_the_other_ready_replicas(pods: list[Pod], want: list[str]) -> None:
    from xpyd_router.discovery import router_peers

    assert router_peers(pods, me="127.0.0.5") == want
