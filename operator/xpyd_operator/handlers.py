"""Kopf glue, kept thin: watch events only enqueue a reconcile; a resync loop re-checks every object.

Only event handlers are used, so Kopf adds no finalizers and writes no annotations of its own:
every write the operator makes is a child apply, a status apply or an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from xpyd_api import labels as L
from xpyd_operator.autoscaling.loop import Autoscalers
from xpyd_operator.kube import Kube, make_client
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_operator.workqueue import WorkQueue

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

log = logging.getLogger("xpyd.operator")


@dataclass(frozen=True)
class Options:
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    resync_seconds: float = 30.0
    concurrency: int = 16
    config: Config = field(default_factory=Config)


def wants_reconcile(event_type: str | None, body: dict[str, Any]) -> bool:
    """Initial listings, additions and spec changes (generation ahead of observedGeneration)."""
    if event_type == "DELETED":
        return False
    if event_type in {None, "ADDED"}:
        return True
    generation = body.get("metadata", {}).get("generation")
    return bool(generation != (body.get("status") or {}).get("observedGeneration"))


async def resync_loop(memo: Any, options: Options) -> None:
    """Every period: enqueue every object (level-based re-check) and start the autoscaler loops it needs."""
    kube: Kube = memo.kube
    queue: WorkQueue = memo.queue
    autoscalers: Autoscalers = memo.autoscalers
    while True:
        await asyncio.sleep(options.resync_seconds)
        try:
            objs: list[dict[str, Any]] = []
            for ns in options.namespaces or ["*"]:
                objs += await kube.list_dds(ns)
            for obj in objs:
                queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
            autoscalers.ensure(objs)
        except Exception as exc:
            log.warning("resync failed: %s", exc)


def in_cluster_login(token_dir: Path = SA_DIR) -> kopf.ConnectionInfo | None:
    """In-cluster credentials addressed as client-go does: KUBERNETES_SERVICE_HOST/PORT, not a DNS name.

    Kopf's own login_with_service_account hard-codes https://kubernetes.default.svc, which needs
    cluster DNS; every pod gets the service host and port in its environment instead.
    """
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = token_dir / "token"
    if not host or not token.exists():
        return None
    server_host = f"[{host}]" if ":" in host else host
    namespace = token_dir / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://{server_host}:{port}",
        ca_path=str(token_dir / "ca.crt"),
        token=token.read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
        expiration=None,
    )


def register(registry: kopf.OperatorRegistry, options: Options) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return in_cluster_login() or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        settings.posting.enabled = False  # we post our own Events on transitions only
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        memo.kube = Kube(make_client())
        memo.reconciler = Reconciler(memo.kube, options.config)
        memo.queue = WorkQueue(memo.reconciler.reconcile, concurrency=options.concurrency)
        memo.autoscalers = Autoscalers(memo.kube.client, lambda ns, name: memo.queue.add((ns, name)))
        memo.resync = asyncio.get_running_loop().create_task(resync_loop(memo, options))
        log.info("xpyd operator started")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        memo.resync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await memo.resync
        await memo.autoscalers.close()
        await memo.queue.close()
        await memo.kube.client.close()

    @kopf.on.event(L.GROUP, L.VERSION, L.PLURAL, registry=registry)
    async def deployment_event(**kw: Any) -> None:
        if wants_reconcile(kw["type"], dict(kw["body"])):
            kw["memo"].queue.add((kw["namespace"], kw["name"]))

    async def child_event(**kw: Any) -> None:
        kw["memo"].queue.add((kw["namespace"], kw["labels"][L.DEPLOYMENT]))

    selector: dict[str, Any] = {L.MANAGED_BY: L.MANAGER, L.DEPLOYMENT: kopf.PRESENT}
    children = [
        ("apps", "v1", "statefulsets"),
        ("apps", "v1", "deployments"),
        (L.LWS_GROUP, L.LWS_VERSION, L.LWS_PLURAL),
    ]
    for group, version, plural in children:  # Kopf waits for the LeaderWorkerSet API when it is not installed
        on_child = kopf.on.event(group, version, plural, labels=selector, registry=registry, id=f"child-{plural}")
        on_child(child_event)
