"""Engine pools: each role's StatefulSet, headless Service and PodDisruptionBudget, and the ComputeDomain."""

from __future__ import annotations

from typing import Any

from xpyd_api import handoff
from xpyd_api import labels as L
from xpyd_operator import engine, groups, podneeds, podsecurity, rollout, routerkit
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.engine_ranks import Rank
from xpyd_operator.meta import Owner, child_name, labels_for, metadata_for, selector

CHANNEL_CLAIM = "imex-channel"
SHM_VOLUME = "dshm"
GPU_TOLERATION = {"key": L.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def compute_domain_name(owner: Owner) -> str:
    return f"{owner.name}-imex"


def _affinity(clique: str | None) -> dict[str, Any] | None:
    if clique is None:
        return None
    term = {"matchExpressions": [{"key": L.GPU_CLIQUE, "operator": "In", "values": [clique]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_template(b: PoolBuild, rank: Rank | None = None) -> dict[str, Any]:
    """The pod template of a pool; `rank` picks the leader or worker template of a multi-node replica."""
    spec, pool = b.spec, b.pool
    pod_labels = labels_for(b.owner, b.role)
    if b.clique is not None:
        pod_labels[L.NVLINK_DOMAIN_LABEL] = b.clique
    main = engine.container(b, rank)
    facts = handoff.pool_facts(spec, pool)
    pod_labels[L.ENGINE_REV] = rollout.engine_rev(main["image"], spec.engine.kv_connector, facts)
    main["securityContext"] = podsecurity.engine_container_context(spec, main["resources"].get("requests", {}))
    pod: dict[str, Any] = {
        "containers": [main],
        "terminationGracePeriodSeconds": spec.engine.drain_seconds + 15,
        "enableServiceLinks": False,
        "securityContext": podsecurity.engine_pod_context(spec),
    }
    if main["securityContext"].get("readOnlyRootFilesystem"):
        main["volumeMounts"] = [podsecurity.tmp_mount()]
        pod["volumes"] = [podsecurity.tmp_volume()]
    else:  # NCCL and the engines' worker processes share tensors through /dev/shm (64 MiB by default)
        main["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]
    if b.node_selector:
        pod["nodeSelector"] = dict(b.node_selector)
    if (affinity := _affinity(b.clique)) is not None:
        pod["affinity"] = affinity
    if b.imex:  # every pod of a multi-node group holds the rack's IMEX channel
        template = f"{compute_domain_name(b.owner)}-channel"
        pod["resourceClaims"] = [{"name": CHANNEL_CLAIM, "resourceClaimTemplateName": template}]
        main["resources"]["claims"] = [{"name": CHANNEL_CLAIM}]
    if pool.gpus_per_replica > 0:
        pod["tolerations"] = [dict(GPU_TOLERATION)]
    if rank == "worker":  # serves no API: nothing to scrape
        return podneeds.dress({"metadata": {"labels": pod_labels}, "spec": pod}, b)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(L.ENGINE_PORT),
        "prometheus.io/path": "/metrics",
    }
    layout = b.layout
    if layout.dp > 1:  # the router reads every rank's KV events, and routes to each rank or lets the engine
        annotations[L.DATA_PARALLEL_SIZE] = str(layout.dp)
        annotations[L.DATA_PARALLEL_LOCAL] = str(layout.dp_local)
        annotations[L.DATA_PARALLEL_ROUTING] = "ranks" if routerkit.rank_routing(spec) else "engine"
    return podneeds.dress({"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod}, b)


def statefulset(b: PoolBuild) -> dict[str, Any]:
    """StatefulSet <name>-<role>; replicas only when the spec sets them, else an external scaler owns them."""
    name = child_name(b.owner, b.role)
    body: dict[str, Any] = {
        "serviceName": name,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector(b.owner, b.role)},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": pod_template(b),
    }
    if b.pool.replicas is not None:
        body["replicas"] = b.pool.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata_for(b.owner, name, b.role),
        "spec": body,
    }


def workload(b: PoolBuild) -> dict[str, Any]:
    """A pool's workload: a StatefulSet of one-pod replicas, or a LeaderWorkerSet of multi-node groups."""
    if not b.layout.multi_node:
        return statefulset(b)
    return groups.leaderworkerset(b, pod_template(b, "leader"), pod_template(b, "worker"))


def headless_service(owner: Owner, role: str) -> dict[str, Any]:
    name = child_name(owner, role)
    ports = [{"name": "http", "port": L.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if role != "worker":
        ports.append({"name": "kv-side", "port": L.NIXL_PORT, "targetPort": "kv-side", "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata_for(owner, name, role),
        "spec": {"clusterIP": "None", "selector": selector(owner, role), "ports": ports},
    }


def disruption_budget(owner: Owner, role: str) -> dict[str, Any]:
    name = child_name(owner, role)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata_for(owner, name, role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(owner, role)}},
    }


def compute_domain(owner: Owner, nodes: int) -> dict[str, Any]:
    """The IMEX channel (ComputeDomain) multi-node NVLink needs on an NVL72 rack."""
    name = compute_domain_name(owner)
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": metadata_for(owner, name, "worker"),
        "spec": {"numNodes": nodes, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }
