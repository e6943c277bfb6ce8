"""Which pods are workers: Ready, not terminating, with a role; URL and NVLink domain from the pod."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube.models.core_v1 import Container, ContainerPort, PodCondition, PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from xpyd_api import labels
from xpyd_router.discovery import pod_worker, workers_of
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
