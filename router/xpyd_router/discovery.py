"""In-cluster discovery: the Ready worker pods of one DisaggregatedDeployment, watched via the API."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from xpyd_api import labels
from xpyd_router.model import Role
from xpyd_router.pool import WorkerSpec

log = logging.getLogger(__name__)
WORKER_ROLES: frozenset[str] = frozenset({"prefill", "decode", "worker"})
DEFAULT_PORT = 8000
RELIST_SECONDS = 60.0


def pod_worker(pod: Any) -> WorkerSpec | None:
    """The worker a pod serves, or None while it is not Ready, is terminating or is no worker."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    pod_labels: dict[str, str] = dict(meta.labels or {}) if meta else {}
    role = pod_labels.get(labels.ROLE, "")
    if role not in WORKER_ROLES or meta is None or meta.deletionTimestamp is not None:
        return None
    if status is None or not status.podIP:
        return None
    if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
        return None
    ports = {p.name: p.containerPort for c in (spec.containers if spec else []) for p in c.ports or [] if p.name}
    port = ports.get("http", DEFAULT_PORT)
    domain = pod_labels.get(labels.NVLINK_DOMAIN_LABEL) or (spec.nodeName if spec else None) or ""
    rev = pod_labels.get(labels.ENGINE_REV, "")
    events, replay = (ports.get(n) for n in (labels.KV_EVENTS_PORT_NAME, labels.KV_REPLAY_PORT_NAME))
    kv_events = f"tcp://{status.podIP}:{events}" if events else ""
    kv_replay = f"tcp://{status.podIP}:{replay}" if events and replay else ""
    return WorkerSpec(f"http://{status.podIP}:{port}", cast(Role, role), domain, rev, kv_events, kv_replay)


def _name(pod: Any) -> str:
    return str(pod.metadata.name) if pod.metadata else ""


def workers_of(pods: Iterable[Any]) -> list[WorkerSpec]:
    return [w for w in map(pod_worker, pods) if w is not None]


async def watch_deployment(
    deployment: str,
    namespace: str,
    apply: Callable[[list[WorkerSpec]], None],
    client: AsyncClient | None = None,
) -> None:
    """Keeps `apply` fed with the current workers: list, then watch; re-list on errors and every minute."""
    client = client or AsyncClient(namespace=namespace)
    selector: dict[str, Any] = {labels.DEPLOYMENT: deployment}
    while True:
        try:
            pods: dict[str, Any] = {}
            async for pod in client.list(Pod, namespace=namespace, labels=selector):
                pods[_name(pod)] = pod
            apply(workers_of(pods.values()))
            async with asyncio.timeout(RELIST_SECONDS):
                async for kind, pod in client.watch(Pod, namespace=namespace, labels=selector):
                    if kind == "DELETED":
                        pods.pop(_name(pod), None)
                    else:
                        pods[_name(pod)] = pod
                    apply(workers_of(pods.values()))
        except TimeoutError:
            continue
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # API hiccup: keep routing to the last known workers, retry soon
            log.warning("pod watch for %s/%s failed: %s; retrying", namespace, deployment, exc)
            await asyncio.sleep(1.0)
