"""Discovery of multi-node replicas: a LeaderWorkerSet group is one worker, at its leader, once every rank is Ready."""

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
from xpyd_router.discovery import complete_groups, group_member, pod_worker, watch_deployment, workers_of
from xpyd_router.pool import WorkerSpec

LEADER_PORTS = [
    ContainerPort(8000, name="http"),
    ContainerPort(5557, name="kv-events"),
    ContainerPort(5657, name="kv-replay"),
]


def rank(
    index: int,
    group: int = 0,
    size: int | None = 4,
    key: str = "k1",
    role: str = "decode",
    ready: bool = True,
    deleting: bool = False,
    lws: str = "dd-decode",
) -> Pod:
    """One pod of a LeaderWorkerSet group as the LWS controller and our operator label it."""
    ip = f"127.0.{group + 1}.{index + 1}"
    meta: dict[str, Any] = {
        "name": f"{lws}-{group}" + (f"-{index}" if index else ""),
        "labels": {
            labels.DEPLOYMENT: "dd", labels.ROLE: role, labels.NVLINK_DOMAIN_LABEL: "clique-a",
            labels.ENGINE_REV: "rev1", labels.LWS_NAME: lws, labels.LWS_GROUP_INDEX: str(group),
            labels.LWS_WORKER_INDEX: str(index), labels.LWS_GROUP_KEY: key,
        },
        "annotations": {} if size is None else {labels.LWS_SIZE: str(size)},
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = datetime(2026, 1, 1, tzinfo=UTC)
    ports = LEADER_PORTS if index == 0 else None  # only the leader declares the engine's ports
    return Pod(
        metadata=ObjectMeta(**meta),
        spec=PodSpec(containers=[Container(name="vllm", ports=ports)], nodeName=f"tray-{group}-{index}"),
        status=PodStatus(podIP=ip, conditions=[PodCondition(type="Ready", status="True" if ready else "False")]),
    )


def group(n: int = 4, g: int = 0, **kw: Any) -> list[Pod]:
    kw.setdefault("size", n)
    return [rank(i, g, **kw) for i in range(n)]


def single(name: str, ip: str, role: str = "prefill") -> Pod:
    """A StatefulSet pod: no LeaderWorkerSet labels."""
    return Pod(
        metadata=ObjectMeta(name=name, labels={labels.DEPLOYMENT: "dd", labels.ROLE: role}),
        spec=PodSpec(containers=[Container(name="vllm")], nodeName="node-1"),
        status=PodStatus(podIP=ip, conditions=[PodCondition(type="Ready", status="True")]),
    )


def leader_spec(g: int = 0) -> WorkerSpec:
    ip = f"127.0.{g + 1}.1"
    return WorkerSpec(f"http://{ip}:8000", "decode", "clique-a", "rev1", f"tcp://{ip}:5557", f"tcp://{ip}:5657")


def replaced(pods: list[Pod], index: int, pod: Pod | None) -> list[Pod]:
    """The group with rank `index` swapped for `pod` (dropped when None)."""
    return [p for i, p in enumerate(pods) if i != index] + ([pod] if pod is not None else [])


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param(group(), [leader_spec()], id="whole-group-ready"),
        pytest.param(group(n=1), [leader_spec()], id="group-of-one"),
        pytest.param(replaced(group(), 2, rank(2, ready=False)), [], id="a-rank-not-ready"),
        pytest.param(replaced(group(), 0, rank(0, ready=False)), [], id="leader-not-ready"),
        pytest.param(replaced(group(), 3, rank(3, deleting=True)), [], id="a-rank-terminating"),
        pytest.param(replaced(group(), 1, None), [], id="a-rank-missing"),
        pytest.param(replaced(group(), 1, rank(1, key="k0")), [], id="a-rank-of-an-older-group-key"),
        pytest.param(replaced(group(), 0, rank(0, key="k0")), [], id="leader-of-an-older-group-key"),
        pytest.param([rank(0)], [], id="leader-only"),
        pytest.param(group()[1:], [], id="ranks-without-leader"),
        pytest.param(group(size=None), [], id="no-size-annotation"),
        pytest.param([*group(), rank(4)], [leader_spec()], id="a-rank-beyond-the-size-is-ignored"),
        pytest.param(group() + group(g=1), [leader_spec(0), leader_spec(1)], id="two-groups"),
        pytest.param(
            group() + replaced(group(g=1), 3, rank(3, 1, ready=False)), [leader_spec(0)], id="two-groups-one-incomplete"
        ),
        pytest.param(
            [single("p-0", "127.0.9.1"), *group(), single("p-1", "127.0.9.2"), rank(0, 1)],
            [
                WorkerSpec("http://127.0.9.1:8000", "prefill", "node-1"),
                leader_spec(),
                WorkerSpec("http://127.0.9.2:8000", "prefill", "node-1"),
            ],
            id="mixed-with-statefulset-pods",
        ),
        pytest.param(
            group(lws="a") + [rank(i, size=4, lws="b") for i in (1, 2, 3)], [leader_spec()], id="same-index-other-lws"
        ),
    ],
)
def test_workers_of_groups(pods: list[Pod], want: list[WorkerSpec]) -> None:
    assert workers_of(pods) == want


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (rank(0), leader_spec()),  # the leader alone serves (its group's readiness is workers_of's job)
        (rank(1), None),  # a headless rank: no HTTP API
        (rank(3), None),
        (rank(0, role="router"), None),
    ],
)
def test_pod_worker_only_the_leader(pod: Pod, want: WorkerSpec | None) -> None:
    assert pod_worker(pod) == want


def test_group_member_reads_the_labels() -> None:
    member = group_member(rank(2, group=5, size=8, key="abc"))
    assert member is not None
    assert (member.group, member.rank, member.size) == (("dd-decode", "5", "abc"), 2, 8)
    assert group_member(single("p", "127.0.9.1")) is None
    assert complete_groups([*group(n=2), *group(n=2, g=1)[:1]]) == {("dd-decode", "0", "k1")}


class FakeClient:
    """lightkube's list and watch over a fixed pod list and event script; the watch then stays open."""

    def __init__(self, pods: list[Pod], script: list[tuple[str, Pod]]) -> None:
        self.pods, self.script, self.idle = pods, script, asyncio.Event()

    async def list(self, *_: Any, **__: Any) -> AsyncIterator[Pod]:
        for p in self.pods:
            yield p

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[tuple[str, Pod]]:
        for event in self.script:
            yield event
        self.idle.set()
        await asyncio.Event().wait()


@pytest.mark.timeout(10)
async def test_the_watch_recomputes_groups_from_every_pod() -> None:
    """A rank's events move its leader in and out: the watch recomputes from the whole pod set each time."""
    pods = group(n=3)
    script = [
        ("MODIFIED", rank(2, size=3, ready=False)),  # a worker rank fails: the group leaves
        ("MODIFIED", rank(2, size=3)),  # it is back: the group returns
        ("DELETED", rank(1, size=3)),  # a rank is gone: the group leaves
        ("ADDED", rank(1, size=3)),
        ("MODIFIED", rank(1, size=3, key="k2")),  # recreated under a new key: the group is not whole
    ]
    client = FakeClient(pods, script)
    seen: list[int] = []
    task = asyncio.create_task(watch_deployment("dd", "ns", lambda ws: seen.append(len(ws)), client))  # type: ignore[arg-type]
    await asyncio.wait_for(client.idle.wait(), 5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert seen == [1, 0, 1, 0, 1, 0]


DP_LEADER = """\
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1500"} 1.0
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # a data-parallel group's leader reports every engine: one replica's load is their sum,
        # its KV usage the fullest engine's, its capacity all of their blocks
        (DP_LEADER, (3.0, 9.0, 0.6, 16 * 2500)),
        # one engine, its config repeated: counted once
        ('vllm:cache_config_info{block_size="16",num_gpu_blocks="8"} 1\n' * 2, (0.0, 0.0, 0.0, 16 * 8)),
    ],
)
def test_a_group_is_one_replica_in_its_leaders_metrics(text: str, want: tuple[float, float, float, int]) -> None:
    from xpyd_router.scrape import parse_metrics

    m = parse_metrics(text)
    assert (m.waiting, m.running, m.kv_usage, m.capacity_tokens) == want


def with_dp(pods: list[Pod], size: int, local: int) -> list[Pod]:
    """The group with the operator's data-parallel annotations on its leader."""
    leader = pods[0]
    assert leader.metadata is not None and leader.metadata.annotations is not None
    leader.metadata.annotations[labels.DATA_PARALLEL_SIZE] = str(size)
    leader.metadata.annotations[labels.DATA_PARALLEL_LOCAL] = str(local)
    return pods


def test_a_data_parallel_group_is_one_target_per_rank_on_its_pods() -> None:
    targets = workers_of(with_dp(group(n=2), size=4, local=2))
    assert [t.url for t in targets] == [f"http://127.0.1.1:8000#dp{r}" for r in range(4)]
    assert [t.kv_events for t in targets] == [
        "tcp://127.0.1.1:5557", "tcp://127.0.1.1:5558", "tcp://127.0.1.2:5559", "tcp://127.0.1.2:5560",
    ]  # fmt: skip
    assert [t.kv_replay for t in targets] == [
        "tcp://127.0.1.1:5657", "tcp://127.0.1.1:5658", "tcp://127.0.1.2:5659", "tcp://127.0.1.2:5660",
    ]  # fmt: skip
    assert {t.role for t in targets} == {"decode"}


def test_an_incomplete_data_parallel_group_has_no_targets() -> None:
    assert workers_of(replaced(with_dp(group(n=2), 4, 2), 1, rank(1, ready=False))) == []


def test_a_single_pod_data_parallel_replica() -> None:
    pod = single("p-0", "127.0.9.1")
    pod.spec.containers[0].ports = LEADER_PORTS  # type: ignore[union-attr]
    pod.metadata.annotations = {labels.DATA_PARALLEL_SIZE: "8", labels.DATA_PARALLEL_LOCAL: "8"}  # type: ignore[union-attr]
    targets = workers_of([pod])
    assert [t.url for t in targets] == [f"http://127.0.9.1:8000#dp{r}" for r in range(8)]
    assert targets[7].kv_events == "tcp://127.0.9.1:5564" and targets[7].kv_replay == "tcp://127.0.9.1:5664"


@pytest.mark.parametrize(
    ("annotations", "targets"),
    [
        ({}, 1),
        ({labels.DATA_PARALLEL_SIZE: "1"}, 1),
        ({labels.DATA_PARALLEL_SIZE: "junk"}, 1),
        ({labels.DATA_PARALLEL_SIZE: "4"}, 4),  # no local count: all on the pod
        ({labels.DATA_PARALLEL_SIZE: "4", labels.DATA_PARALLEL_LOCAL: "9"}, 4),  # nonsense local: all on the pod
    ],
)
def test_data_parallel_annotations_read_defensively(annotations: dict[str, str], targets: int) -> None:
    pod = single("p-0", "127.0.9.1")
    pod.metadata.annotations = annotations  # type: ignore[union-attr]
    assert len(workers_of([pod])) == targets
