"""Multi-node pools as LeaderWorkerSets: one group of pods per replica, recreated whole when a rank fails.

A replica larger than one node runs as a LeaderWorkerSet group (docs/architecture.md, multi-node): `size` pods,
one per node, the leader serving the API; `replicas` counts groups, so every scaler (ours, HPA
through the scale subresource) adds or removes whole groups. `RecreateGroupOnPodRestart` restarts
the whole group when one rank restarts, as the engines need (a collective cannot lose a member).
Placement: on a rack-scale system a pinned pool lands in its clique; an unpinned one keeps each
group inside one clique by requiring every worker to share its leader's clique.
"""

from __future__ import annotations

from typing import Any, Final

from xpyd_api import labels as L
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.meta import Owner, child_name, metadata_for

API_VERSION: Final = f"{L.LWS_GROUP}/{L.LWS_VERSION}"
KIND: Final = "LeaderWorkerSet"
CRD: Final = f"{L.LWS_PLURAL}.{L.LWS_GROUP}"
INSTALL_HINT: Final = (
    "install LeaderWorkerSet v0.7.0 or later: kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/lws/releases/download/v0.7.0/manifests.yaml"
)


def same_clique_as_leader(name: str) -> dict[str, Any]:
    """Pod affinity that keeps a group's workers in its leader's NVLink clique (matchLabelKeys: one group)."""
    term = {
        "labelSelector": {"matchLabels": {L.LWS_NAME: name, L.LWS_WORKER_INDEX: "0"}},
        "matchLabelKeys": [L.LWS_GROUP_KEY],
        "topologyKey": L.GPU_CLIQUE,
    }
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def leaderworkerset(b: PoolBuild, leader: dict[str, Any], worker: dict[str, Any]) -> dict[str, Any]:
    """LeaderWorkerSet <name>-<role>; replicas only when the spec sets them, else an external scaler owns them."""
    name = child_name(b.owner, b.role)
    topology = b.spec.topology.hardware
    layout = b.layout
    if topology is not None and topology.nvlink_domain == "clique" and b.clique is None:
        worker["spec"]["affinity"] = {**(worker["spec"].get("affinity") or {}), **same_clique_as_leader(name)}
    body: dict[str, Any] = {
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": rollout_strategy(),
        "networkConfig": {"subdomainPolicy": "Shared"},
        "leaderWorkerTemplate": {
            "size": layout.pods,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader,
            "workerTemplate": worker,
        },
    }
    if b.pool.replicas is not None:
        body["replicas"] = b.pool.replicas
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata_for(b.owner, name, b.role), "spec": body}


def rollout_strategy(partition: int = 0) -> dict[str, Any]:
    """The LeaderWorkerSet's rollout: groups with an index at or above `partition` take the new template.

    An engine change moves `partition` one group per pool at a time (xpyd_operator.lockstep), so the
    controller's own surge stays 0 (the lockstep writes surge groups into `replicas`) and its
    maxUnavailable 1 (never 0 beside maxSurge 0): it lets the controller replace the one group each step
    hands it, and never more, since the partition is always the floor of what it replaces.
    """
    config = {"partition": partition, "maxSurge": 0, "maxUnavailable": 1}
    return {"type": "RollingUpdate", "rollingUpdateConfiguration": config}


def templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a StatefulSet (one) or a LeaderWorkerSet (leader, then worker)."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == KIND:
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    return [spec["template"]] if spec.get("template") else []


def api_template(workload: dict[str, Any]) -> dict[str, Any]:
    """The template of the pods that serve the API: the StatefulSet's, or the LeaderWorkerSet's leader."""
    found = templates(workload)
    return found[0] if found else {}


def rolled(workload: dict[str, Any]) -> tuple[bool, bool]:
    """(caught up, every replica updated and ready) from a workload's status."""
    spec, status = workload.get("spec") or {}, workload.get("status") or {}
    want = spec.get("replicas") or 0
    updated = (status.get("updatedReplicas") or 0) >= want
    ready = (status.get("readyReplicas") or 0) >= want
    if workload.get("kind") == KIND:  # no observedGeneration: its UpdateInProgress condition says so
        conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        return conds.get("UpdateInProgress") != "True" and updated, updated and ready
    caught_up = status.get("observedGeneration") == (workload.get("metadata") or {}).get("generation")
    same_revision = status.get("currentRevision") == status.get("updateRevision")
    return caught_up and same_revision and updated, caught_up and same_revision and updated and ready


def by_name(children: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any] | None:
    """A pool's observed or desired workload by name, whichever kind it is."""
    return children.get(("StatefulSet", name)) or children.get((KIND, name))


def find(children: dict[tuple[str, str], dict[str, Any]], owner: Owner, role: str) -> dict[str, Any] | None:
    return by_name(children, child_name(owner, role))


def pods_per_replica(workload: dict[str, Any]) -> int:
    """Pods of one replica: the LeaderWorkerSet's group size, 1 for a StatefulSet."""
    if workload.get("kind") != KIND:
        return 1
    return int(((workload.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)
