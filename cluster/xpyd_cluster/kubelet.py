"""The process kubelet: runs the pods bound to the local cluster's fake nodes as local processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from . import hosts, podspec, realvllm, shims
from .ipam import LoopbackIPAM
from .nodes import LOCAL_NODE
from .paths import Layout, default_layout
from .podrun import PodRunner

log = logging.getLogger("xpyd.kubelet")


class Kubelet:
    """Level-based: every pod event is compared with the processes it runs."""

    def __init__(self, client: AsyncClient, layout: Layout) -> None:
        self.client, self.layout = client, layout
        self.nodes: dict[str, dict[str, str]] = {}
        self.runners: dict[str, PodRunner] = {}
        self.stopping: dict[str, asyncio.Task[None]] = {}
        self.ipam = LoopbackIPAM()
        self.hosts: dict[str, hosts.HostEntry] = {}  # by pod uid, in start order: a successor's entry wins
        self.xpyd = str(Path(sys.executable).with_name("xpyd"))
        shims.install(layout.shims, self.xpyd, sys.executable)
        hosts.write(layout.hosts_file, [])

    async def load_nodes(self) -> None:
        async for node in self.client.list(Node, labels={LOCAL_NODE: "true"}):
            assert node.metadata is not None
            assert node.metadata.name is not None
            self.nodes[node.metadata.name] = dict(node.metadata.labels or {})

    async def handle(self, event: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        uid, node = meta["uid"], spec.get("nodeName")
        if not node or node not in self.nodes:
            return
        if event == "DELETED":
            await self._stop(uid, grace=1.0)
            return
        if meta.get("deletionTimestamp"):
            if uid not in self.stopping:
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                self.stopping[uid] = asyncio.create_task(self._delete(pod, grace))
            return
        if uid in self.runners or pod.get("status", {}).get("phase") in {"Succeeded", "Failed"}:
            return
        ip = pod.get("status", {}).get("podIP") or self.ipam.allocate()
        self.ipam.claim(ip)
        facts = podspec.NodeFacts(node, self.nodes[node], api_port=self.layout.apiserver_port)
        try:
            release = realvllm.image_version(str(pod["spec"]["containers"][0].get("image", "")))
            real = str(realvllm.venv_python(version=release)) if realvllm.is_installed(version=release) else None
            launch = podspec.plan(
                pod, ip, facts, self.xpyd, shims=str(self.layout.shims), hosts_file=str(self.layout.hosts_file),
                real_vllm=real,
            )  # fmt: skip
        except (KeyError, ValueError) as exc:
            log.error("cannot run pod %s/%s: %s", meta["namespace"], meta["name"], exc)
            return
        runner = PodRunner(
            self.client,
            pod,
            launch,
            ip,
            self.layout.pods / uid,
            self.layout.pki / "ca.crt",
            str(self.layout.state),
        )
        self.runners[uid] = runner
        if (entry := hosts.entry_of(pod, ip)) is not None:
            self._set_host(uid, entry)
        log.info("starting pod %s/%s (%s) at %s on %s", meta["namespace"], meta["name"], launch.kind, ip, node)
        runner.start()

    def _set_host(self, uid: str, entry: hosts.HostEntry | None) -> None:
        """Add (or, with None, remove) a pod's host names and rewrite the hosts file."""
        if entry is None and self.hosts.pop(uid, None) is None:
            return
        if entry is not None:
            self.hosts[uid] = entry
        hosts.write(self.layout.hosts_file, self.hosts.values())

    async def _stop(self, uid: str, grace: float, hook: bool = False) -> None:
        """Stop a pod's process; `hook`: its preStop hook first (a deletion, not the pod's object gone)."""
        self._set_host(uid, None)  # a stopping pod no longer answers to its name
        runner = self.runners.pop(uid, None)
        if runner is not None:
            await runner.stop(grace, hook=hook)
            self.ipam.release(runner.ip)

    async def _delete(self, pod: dict[str, Any], grace: float) -> None:
        meta = pod["metadata"]
        try:
            await self._stop(meta["uid"], grace, hook=True)
            with contextlib.suppress(Exception):
                await self.client.delete(Pod, meta["name"], namespace=meta["namespace"], grace_period=0)
        finally:
            self.stopping.pop(meta["uid"], None)

    async def run(self) -> None:
        await self.load_nodes()
        log.info("process kubelet managing %d nodes", len(self.nodes))
        while True:
            try:
                async for event, obj in self.client.watch(Pod, namespace="*"):
                    pod = obj.to_dict()
                    if pod.get("spec", {}).get("nodeName") not in self.nodes:
                        await self.load_nodes()
                    await self.handle(event, pod)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pod watch failed; resuming")
                await asyncio.sleep(1)

    async def shutdown(self) -> None:
        await asyncio.gather(*(self._stop(uid, grace=3.0) for uid in list(self.runners)))


async def _main(layout: Layout) -> None:
    config = KubeConfig.from_file(str(layout.kubeconfig_for("kubelet")))
    client = AsyncClient(config=config, field_manager="xpyd-kubelet")
    kubelet = Kubelet(client, layout)
    task = asyncio.create_task(kubelet.run())
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await kubelet.shutdown()
    await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpyd kubelet", description=__doc__)
    parser.add_argument("--verbose", action="store_true")
    ns = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if ns.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_main(default_layout()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
