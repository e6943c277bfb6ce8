"""In-cluster discovery: the Ready worker pods of one DisaggregatedDeployment, watched via the API.

A single-pod replica (a StatefulSet pod) is a worker while it is Ready. A multi-node replica is a
LeaderWorkerSet group: only its leader (worker-index 0) runs the engine's API server, so the group
is one worker, at the leader's address, and only while every rank of the group is Ready. A vLLM
data-parallel replica (the operator's xpyd.io/data-parallel-size annotations on its API pod) is one
target per data-parallel rank, each subscribed to the events of the pod that runs the rank; where the
engine picks the rank (xpyd.io/data-parallel-routing: engine), it is one target subscribed to every
rank's events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from xpyd_api import labels
from xpyd_router.model import Role
from xpyd_router.pool import WorkerSpec, rank_targets, replica_target

log = logging.getLogger(__name__)
WORKER_ROLES: frozenset[str] = frozenset({"prefill", "decode", "worker"})
DEFAULT_PORT = 8000
RELIST_SECONDS = 60.0
LEADER_INDEX = 0  # the rank whose pod runs the engine's HTTP API
# How the operator has a data-parallel replica routed: "ranks" (the router pins each rank; the default,
# as operators that annotate only the sizes mean) or "engine" (the engine picks; events still per rank).


@dataclass(frozen=True, slots=True)
class GroupMember:
    """Where a pod sits in its LeaderWorkerSet group: which group incarnation, its rank, the group's size."""

    group: tuple[str, str, str]  # (LeaderWorkerSet name, group index, group key): one incarnation of a replica
    rank: int  # worker index; LEADER_INDEX for the API pod, -1 when unreadable
    size: int  # pods per group from the size annotation; 0 when unreadable


def _number(raw: str | None) -> int:
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def group_member(pod: Any) -> GroupMember | None:
    """The pod's place in a LeaderWorkerSet group, or None for a single-pod replica (no LWS labels)."""
    meta = pod.metadata
    pod_labels: dict[str, str] = dict(meta.labels or {}) if meta else {}
    if labels.LWS_NAME not in pod_labels and labels.LWS_WORKER_INDEX not in pod_labels:
        return None
    annotations: dict[str, str] = dict(meta.annotations or {}) if meta else {}
    group = (
        pod_labels.get(labels.LWS_NAME, ""),
        pod_labels.get(labels.LWS_GROUP_INDEX, ""),
        pod_labels.get(labels.LWS_GROUP_KEY, ""),
    )
    rank = _number(pod_labels.get(labels.LWS_WORKER_INDEX))
    return GroupMember(group, rank, max(_number(annotations.get(labels.LWS_SIZE)), 0))


def _live(pod: Any) -> bool:
    """Ready and not terminating: the pod does its part now."""
    meta, status = pod.metadata, pod.status
    if meta is None or meta.deletionTimestamp is not None or status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def pod_worker(pod: Any) -> WorkerSpec | None:
    """The worker a pod serves, or None while it is not Ready, is terminating or is no worker.

    A rank of a LeaderWorkerSet group other than the leader never serves: it has no HTTP API.
    Whether the leader's whole group is Ready is `workers_of`'s question (it sees every pod).
    """
    meta, spec, status = pod.metadata, pod.spec, pod.status
    pod_labels: dict[str, str] = dict(meta.labels or {}) if meta else {}
    role = pod_labels.get(labels.ROLE, "")
    if role not in WORKER_ROLES or not _live(pod) or not status.podIP:
        return None
    member = group_member(pod)
    if member is not None and member.rank != LEADER_INDEX:
        return None
    ports = {p.name: p.containerPort for c in (spec.containers if spec else []) for p in c.ports or [] if p.name}
    port = ports.get("http", DEFAULT_PORT)
    domain = _domain(pod)
    rev = pod_labels.get(labels.ENGINE_REV, "")
    events, replay = (ports.get(n) for n in (labels.KV_EVENTS_PORT_NAME, labels.KV_REPLAY_PORT_NAME))
    kv_events = f"tcp://{status.podIP}:{events}" if events else ""
    kv_replay = f"tcp://{status.podIP}:{replay}" if events and replay else ""
    return WorkerSpec(f"http://{status.podIP}:{port}", cast(Role, role), domain, rev, kv_events, kv_replay)


def _name(pod: Any) -> str:
    return str(pod.metadata.name) if pod.metadata else ""


def complete_groups(pods: Iterable[Any]) -> set[tuple[str, str, str]]:
    """The groups whose every rank (0..size-1, as the size annotation says) has a live pod."""
    live: dict[tuple[str, str, str], set[int]] = {}
    sizes: dict[tuple[str, str, str], int] = {}
    for pod in pods:
        member = group_member(pod)
        if member is None:
            continue
        if member.rank == LEADER_INDEX:
            sizes[member.group] = member.size
        if _live(pod) and member.rank >= 0:
            live.setdefault(member.group, set()).add(member.rank)
    return {g for g, size in sizes.items() if size >= 1 and live.get(g, set()) >= set(range(size))}


def _domain(pod: Any) -> str:
    pod_labels: dict[str, str] = dict(pod.metadata.labels or {}) if pod.metadata else {}
    return pod_labels.get(labels.NVLINK_DOMAIN_LABEL) or (pod.spec.nodeName if pod.spec else None) or ""


def data_parallel(pod: Any) -> tuple[int, int]:
    """(ranks, ranks per pod) the operator's annotations give a vLLM data-parallel replica's API pod;
    (1, 1) for any other (one target: the engine picks the rank)."""
    annotations: dict[str, str] = dict(pod.metadata.annotations or {}) if pod.metadata else {}
    size = _number(annotations.get(labels.DATA_PARALLEL_SIZE))
    if size <= 1:
        return 1, 1
    local = _number(annotations.get(labels.DATA_PARALLEL_LOCAL))
    return size, local if 1 <= local <= size else size


def engine_picks_rank(pod: Any) -> bool:
    """Whether the operator left a data-parallel replica's rank to its engine (the API server balances)."""
    annotations: dict[str, str] = dict(pod.metadata.annotations or {}) if pod.metadata else {}
    return annotations.get(labels.DATA_PARALLEL_ROUTING) == "engine"


def workers_of(pods: Iterable[Any]) -> list[WorkerSpec]:
    """The routing targets of a whole pod list: Ready single pods, and the leaders of complete groups
    (one each); a data-parallel replica's API pod gives one target per rank, each with the events of
    the group's pod that runs the rank (xpyd_router.targets)."""
    pods = list(pods)
    complete = complete_groups(pods)
    members: dict[tuple[str, str, str], dict[int, tuple[str, str]]] = {}
    for pod in pods:
        member = group_member(pod)
        if member is not None and member.group in complete and member.rank >= 0 and _live(pod):
            members.setdefault(member.group, {})[member.rank] = (str(pod.status.podIP or ""), _domain(pod))
    out = []
    for pod in pods:
        worker = pod_worker(pod)
        if worker is None:
            continue
        member = group_member(pod)
        if member is not None and member.group not in complete:
            continue
        size, local = data_parallel(pod)
        ranks = members.get(member.group, {}) if member is not None else {}
        hosts = [ranks[i] for i in range(len(ranks)) if i in ranks]
        if size > 1 and engine_picks_rank(pod):
            out.append(replica_target(worker, size, local, hosts))
        else:
            out.extend(rank_targets(worker, size, local, hosts))
    return out


def router_peers(pods: Iterable[Any], me: str) -> list[str]:
    """Base URLs of the deployment's other Ready router replicas (not the one at IP `me`), sorted."""
    out = []
    for pod in pods:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        role = (dict(meta.labels or {}) if meta else {}).get(labels.ROLE)
        if role != "router" or not _live(pod) or not status.podIP or status.podIP == me:
            continue
        ports = {p.name: p.containerPort for c in (spec.containers if spec else []) for p in c.ports or [] if p.name}
        out.append(f"http://{status.podIP}:{ports.get('http', DEFAULT_PORT)}")
    return sorted(out)


async def watch_deployment(
    deployment: str,
    namespace: str,
    apply: Callable[[list[WorkerSpec]], None],
    client: AsyncClient | None = None,
    peers: Callable[[list[str]], None] | None = None,
    me: str = "",
) -> None:
    """Keeps `apply` fed with the current workers: list, then watch; re-list on errors and every minute.

    Every event updates the full pod set and recomputes the workers from all of it: a group's
    readiness depends on several pods, so no event is applied to the workers on its own. `peers`,
    when given, gets the other router replicas (pods of role router other than the one at IP `me`).
    """

    def publish(current: Iterable[Any]) -> None:
        current = list(current)
        apply(workers_of(current))
        if peers is not None:
            peers(router_peers(current, me))

    client = client or AsyncClient(namespace=namespace)
    selector: dict[str, Any] = {labels.DEPLOYMENT: deployment}
    while True:
        try:
            pods: dict[str, Any] = {}
            async for pod in client.list(Pod, namespace=namespace, labels=selector):
                pods[_name(pod)] = pod
            publish(pods.values())
            async with asyncio.timeout(RELIST_SECONDS):
                async for kind, pod in client.watch(Pod, namespace=namespace, labels=selector):
                    if kind == "DELETED":
                        pods.pop(_name(pod), None)
                    else:
                        pods[_name(pod)] = pod
                    publish(pods.values())
        except TimeoutError:
            continue
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # API hiccup: keep routing to the last known workers, retry soon
            log.warning("pod watch for %s/%s failed: %s; retrying", namespace, deployment, exc)
            await asyncio.sleep(1.0)
