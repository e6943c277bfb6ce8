"""All Kubernetes I/O of the reconciler, through lightkube: observe, server-side apply, delete, events."""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod, Service, ServiceAccount
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.types import PatchType

from xpyd_api import labels as L
from xpyd_operator import groups
from xpyd_operator.desired import Observed
from xpyd_operator.meta import Owner
from xpyd_operator.opmetrics import write
from xpyd_operator.placement import NodeInfo, PodInfo, Reservation
from xpyd_perf import Topology

DD = create_namespaced_resource(L.GROUP, L.VERSION, L.KIND, L.PLURAL)
ComputeDomain = create_namespaced_resource("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains")
COMPUTE_DOMAIN_CRD = "computedomains.resource.nvidia.com"
LeaderWorkerSet = create_namespaced_resource(L.LWS_GROUP, L.LWS_VERSION, groups.KIND, L.LWS_PLURAL)
PodMonitor = create_namespaced_resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"
KINDS: dict[str, Any] = {
    "StatefulSet": StatefulSet,
    "Deployment": Deployment,
    "Service": Service,
    "ServiceAccount": ServiceAccount,
    "PodDisruptionBudget": PodDisruptionBudget,
    "Role": Role,
    "RoleBinding": RoleBinding,
    "ComputeDomain": ComputeDomain,
    "NetworkPolicy": NetworkPolicy,
    groups.KIND: LeaderWorkerSet,
    "PodMonitor": PodMonitor,
}
_CRD_TTL = 60.0
_NODES_TTL = 5.0


def make_client() -> AsyncClient:
    """A client from the in-cluster service account or KUBECONFIG (~/.kube/config)."""
    return AsyncClient(config=KubeConfig.from_env(), field_manager=L.MANAGER)


def as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj.to_dict())


def _gpus(quantity: Any) -> int:
    try:
        return int(str(quantity or 0))
    except ValueError:
        return 0


def pod_gpus(pod_spec: dict[str, Any]) -> int:
    total = 0
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        total += _gpus((res.get("limits") or {}).get(L.GPU_RESOURCE) or (res.get("requests") or {}).get(L.GPU_RESOURCE))
    return total


def node_info(node: dict[str, Any]) -> NodeInfo:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    gpus = _gpus((status.get("allocatable") or {}).get(L.GPU_RESOURCE))
    return NodeInfo(meta["name"], dict(meta.get("labels") or {}), gpus, not spec.get("unschedulable", False))


def pod_info(pod: dict[str, Any]) -> PodInfo | None:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    phase = (pod.get("status") or {}).get("phase")
    if not spec.get("nodeName") or phase in {"Succeeded", "Failed"}:
        return None
    lab = meta.get("labels") or {}
    owner = f"{meta.get('namespace')}/{lab[L.DEPLOYMENT]}" if L.DEPLOYMENT in lab else None
    return PodInfo(spec["nodeName"], pod_gpus(spec), owner, lab.get(L.NVLINK_DOMAIN_LABEL))


def reservation(workload: dict[str, Any]) -> Reservation | None:
    """GPUs a StatefulSet or LeaderWorkerSet of ours pins to a clique: replicas x pods per replica x GPUs per pod."""
    meta, spec = workload["metadata"], workload.get("spec") or {}
    template = groups.api_template(workload)
    clique = ((template.get("metadata") or {}).get("labels") or {}).get(L.NVLINK_DOMAIN_LABEL)
    name = (meta.get("labels") or {}).get(L.DEPLOYMENT)
    if not clique or not name:
        return None
    pods = int(spec.get("replicas") or 0) * groups.pods_per_replica(workload)
    return Reservation(f"{meta.get('namespace')}/{name}", clique, pods * pod_gpus(template.get("spec") or {}))


class Kube:
    """The reconciler's view of the API server; one instance per operator."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._crds: dict[str, tuple[float, bool]] = {}
        self._nodes: tuple[float, list[NodeInfo]] | None = None
        self.instance = socket.gethostname()

    async def get_dd(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return as_dict(await self.client.get(DD, name, namespace=namespace))
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    async def get_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data (spec.model.configMap: the model's config.json); None when there is none.

        PermissionError when the operator may not read it (the chart grants get on configmaps)."""
        try:
            found = as_dict(await self.client.get(ConfigMap, name, namespace=namespace))
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            if exc.status.code == 403:
                raise PermissionError(exc.status.message or "forbidden") from None
            raise
        return {str(k): str(v) for k, v in (found.get("data") or {}).items()}

    async def list_dds(self, namespace: str) -> list[dict[str, Any]]:
        return [as_dict(o) async for o in self.client.list(DD, namespace=namespace)]

    async def has_crd(self, name: str) -> bool:
        """Whether a CustomResourceDefinition is installed, re-read at most once a minute."""
        now = time.monotonic()
        cached = self._crds.get(name)
        if cached is None or now - cached[0] > _CRD_TTL:
            try:
                await self.client.get(CustomResourceDefinition, name)
                found = True
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                found = False
            cached = self._crds[name] = (now, found)
        return cached[1]

    async def compute_domain_crd(self) -> bool:
        return await self.has_crd(COMPUTE_DOMAIN_CRD)

    async def nodes(self) -> list[NodeInfo]:
        """Nodes' labels and allocatable GPUs, re-read at most every few seconds (they rarely change)."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > _NODES_TTL:
            self._nodes = (now, [node_info(as_dict(n)) async for n in self.client.list(Node)])
        return list(self._nodes[1])

    async def observe(self, owner: Owner, topology: Topology | None) -> Observed:
        wants_cd = topology is not None and topology.compute_domain
        obs = Observed(
            compute_domain_crd=await self.compute_domain_crd() if wants_cd else False,
            lws_crd=await self.has_crd(groups.CRD),
            pod_monitor_crd=await self.has_crd(POD_MONITOR_CRD),
        )
        selector: dict[str, Any] = {L.DEPLOYMENT: owner.name, L.MANAGED_BY: L.MANAGER}
        installed = {
            "ComputeDomain": obs.compute_domain_crd,
            groups.KIND: obs.lws_crd,
            "PodMonitor": obs.pod_monitor_crd,
        }
        for kind, res in KINDS.items():
            if not installed.get(kind, True):  # a custom resource whose API the cluster does not serve
                continue
            async for item in self.client.list(res, namespace=owner.namespace, labels=selector):
                obj = as_dict(item)
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner.uid for r in refs):
                    obs.children[(kind, obj["metadata"]["name"])] = obj
        mine: dict[str, Any] = {L.DEPLOYMENT: owner.name}
        pods = [as_dict(p) async for p in self.client.list(Pod, namespace=owner.namespace, labels=mine)]
        obs.own_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(L.ROLE) != "router"]
        obs.nodes = await self.nodes()
        if topology is not None and topology.nvlink_domain == "clique":  # free GPUs per clique, cluster-wide
            infos = [pod_info(as_dict(p)) async for p in self.client.list(Pod, namespace="*")]
            obs.pods = [p for p in infos if p is not None and p.gpus > 0]
            ours: dict[str, Any] = {L.MANAGED_BY: L.MANAGER}
            sets = [reservation(as_dict(s)) async for s in self.client.list(StatefulSet, namespace="*", labels=ours)]
            if obs.lws_crd:
                lws = self.client.list(LeaderWorkerSet, namespace="*", labels=ours)
                sets += [reservation(as_dict(s)) async for s in lws]
            obs.reservations = [r for r in sets if r is not None]
        return obs

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        res = KINDS[manifest["kind"]]
        meta = manifest["metadata"]
        write("apply", manifest["kind"])
        out = await self.client.patch(
            res,
            meta["name"],
            manifest,
            namespace=meta["namespace"],
            patch_type=PatchType.APPLY,
            field_manager=L.MANAGER,
            force=True,
        )
        return as_dict(out)

    async def delete(self, kind: str, name: str, namespace: str) -> None:
        write("delete", kind)
        try:
            await self.client.delete(KINDS[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def apply_status(self, owner: Owner, status: dict[str, Any]) -> None:
        body = {
            "apiVersion": f"{L.GROUP}/{L.VERSION}",
            "kind": L.KIND,
            "metadata": {"name": owner.name, "namespace": owner.namespace},
            "status": status,
        }
        write("apply", f"{L.KIND}/status")
        await self.client.patch(
            DD.Status,
            owner.name,
            body,
            namespace=owner.namespace,
            patch_type=PatchType.APPLY,
            field_manager=L.MANAGER,
            force=True,
        )

    async def event(self, owner: Owner, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the DisaggregatedDeployment; failures are not fatal."""
        stamp = dt.datetime.now(dt.UTC)
        ref = ObjectReference(
            apiVersion=f"{L.GROUP}/{L.VERSION}",
            kind=L.KIND,
            name=owner.name,
            namespace=owner.namespace,
            uid=owner.uid,
        )
        event = Event(
            metadata=ObjectMeta(generateName=f"{owner.name}.", namespace=owner.namespace),
            involvedObject=ref,
            reason=reason,
            message=message[:1000],
            type=type_,
            source=EventSource(component=L.MANAGER),
            firstTimestamp=stamp,
            lastTimestamp=stamp,
            count=1,
            reportingComponent=L.MANAGER,
            reportingInstance=self.instance or os.environ.get("HOSTNAME", "xpyd-operator"),
        )
        write("create", "Event")
        await self.client.create(event)
