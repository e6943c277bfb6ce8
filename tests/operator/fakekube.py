"""In-memory API server and sample data for tests of the reconciler (and of the autoscaler beside it)."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

from xpyd_api import conditions as C
from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator.desired import Observed
from xpyd_operator.meta import Owner
from xpyd_operator.placement import NodeInfo
from xpyd_perf import TOPOLOGIES, Topology

OWNER = Owner("llama", "ns1", "uid-1")
CLIQUE_A = "cluster-uuid.0"
CLIQUE_B = "cluster-uuid.1"


def spec(**overrides: Any) -> DisaggregatedDeploymentSpec:
    body: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "topology": {"kind": "HGX-B200"},
        "prefill": {"replicas": 2, "gpusPerReplica": 8},
        "decode": {"replicas": 4, "gpusPerReplica": 8},
    }
    body.update(overrides)
    return DisaggregatedDeploymentSpec.model_validate(body)


def b200_nodes(n: int = 4) -> list[NodeInfo]:
    lab = TOPOLOGIES["HGX-B200"].node_labels()
    return [NodeInfo(f"b200-{i}", lab, 8) for i in range(n)]


def nvl72_nodes(racks: int = 2, trays: int = 18) -> list[NodeInfo]:
    out = []
    for r, clique in enumerate([CLIQUE_A, CLIQUE_B][:racks]):
        lab = TOPOLOGIES["GB200-NVL72"].node_labels(clique)
        out += [NodeInfo(f"gb200-r{r}-t{t}", lab, 4) for t in range(trays)]
    return out


class FakeKube:
    """An in-memory API server for one namespace: enough for the reconciler."""

    def __init__(self, dd_spec: dict[str, Any], nodes: list[NodeInfo], generation: int = 1) -> None:
        self.dd: dict[str, Any] | None = {
            "apiVersion": "xpyd.io/v1alpha1",
            "kind": L.KIND,
            "metadata": {
                "name": OWNER.name,
                "namespace": OWNER.namespace,
                "uid": OWNER.uid,
                "generation": generation,
            },
            "spec": dd_spec,
        }
        self.nodes = nodes
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.fail_next_apply = 0
        self.compute_domain_crd = False
        self.lws_crd = False
        self.pod_monitor_crd = False
        self.config_maps: dict[str, dict[str, str]] = {}  # name -> data, in the deployment's namespace
        self.forbidden_config_maps = False  # RBAC without get on configmaps
        self.simulate_pods = False  # settle() plays the StatefulSet controller's pods too (partitions honoured)
        self.pods: dict[str, dict[str, Any]] = {}  # name -> pod, when simulate_pods

    async def get_dd(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.dd)

    async def get_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        if self.forbidden_config_maps:
            raise PermissionError(f'configmaps "{name}" is forbidden')
        found = self.config_maps.get(name)
        return dict(found) if found is not None else None

    async def observe(self, owner: Owner, topology: Topology | None) -> Observed:
        children = copy.deepcopy(self.objects)
        return Observed(
            nodes=list(self.nodes),
            children=children,
            own_pods=copy.deepcopy(list(self.pods.values())),
            compute_domain_crd=self.compute_domain_crd,
            lws_crd=self.lws_crd,
            pod_monitor_crd=self.pod_monitor_crd,
        )

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.fail_next_apply:
            self.fail_next_apply -= 1
            raise RuntimeError("apiserver unavailable")
        key = (manifest["kind"], manifest["metadata"]["name"])
        stored = copy.deepcopy(manifest)
        stored["metadata"]["generation"] = self.objects.get(key, {}).get("metadata", {}).get("generation", 0) + 1
        self.objects[key] = stored
        self.writes.append(f"apply {key[0]}/{key[1]}")
        return copy.deepcopy(stored)

    async def delete(self, kind: str, name: str, namespace: str) -> None:
        self.objects.pop((kind, name), None)
        self.writes.append(f"delete {kind}/{name}")

    async def apply_status(self, owner: Owner, status: dict[str, Any]) -> None:
        assert self.dd is not None
        self.dd["status"] = copy.deepcopy(status)
        self.writes.append("status")

    async def event(self, owner: Owner, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def settle(self, ready: bool = True) -> None:
        """Play the controllers: every StatefulSet, LeaderWorkerSet and Deployment rolled out and ready.

        With `simulate_pods`, each StatefulSet's pods too, as its controller keeps them: ordinals below
        the replicas, those at or above the partition on the template's engine revision, the rest as they
        were; and each LeaderWorkerSet's groups alike (a group: a leader `<name>-<g>` and workers
        `<name>-<g>-<w>`, made and replaced whole). `ready=False`: the pods this call makes or replaces
        are not ready yet, the others unchanged.
        """
        if self.simulate_pods:
            self._play_statefulset_pods(ready)
            self._play_leaderworkerset_pods(ready)
        for (kind, _), obj in self.objects.items():
            if kind == "LeaderWorkerSet":
                n = obj["spec"].get("replicas", 1)
                obj["spec"].setdefault("replicas", n)
                obj["status"] = {"replicas": n, "readyReplicas": n, "updatedReplicas": n, "conditions": []}
            if kind in {"StatefulSet", "Deployment"}:
                n = obj["spec"].get("replicas", 1)
                obj["spec"].setdefault("replicas", n)
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "replicas": n,
                    "readyReplicas": n,
                    "updatedReplicas": n,
                    "currentRevision": "r1",
                    "updateRevision": "r1",
                }

    def _play_statefulset_pods(self, ready: bool) -> None:
        for (kind, name), obj in self.objects.items():
            if kind != "StatefulSet":
                continue
            spec = obj["spec"]
            template = spec["template"]
            labels = dict(template["metadata"]["labels"])
            rev = labels.get(L.ENGINE_REV, "")
            partition = int(((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition") or 0)
            replicas = int(spec.get("replicas", 1))
            for pod in [p for p in self.pods if p.startswith(f"{name}-") and int(p.rsplit("-", 1)[1]) >= replicas]:
                del self.pods[pod]
            for i in range(replicas):
                pod_name = f"{name}-{i}"
                have = self.pods.get(pod_name)
                if have is not None and (i < partition or have["metadata"]["labels"].get(L.ENGINE_REV) == rev):
                    if ready:  # kept (below the partition, or on the template's revision): settled means ready
                        have["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
                    continue
                conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
                self.pods[pod_name] = {
                    "metadata": {"name": pod_name, "labels": labels},
                    "spec": copy.deepcopy(template["spec"]),
                    "status": {"conditions": conditions, "containerStatuses": [{"name": "engine", "restartCount": 0}]},
                }

    def _play_leaderworkerset_pods(self, ready: bool) -> None:
        for (kind, name), obj in self.objects.items():
            if kind != "LeaderWorkerSet":
                continue
            spec = obj["spec"]
            lwt = spec["leaderWorkerTemplate"]
            size, replicas = int(lwt.get("size") or 1), int(spec.get("replicas", 1))
            config = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
            partition = int(config.get("partition") or 0)
            rev = lwt["leaderTemplate"]["metadata"]["labels"].get(L.ENGINE_REV, "")
            mine = {p: pod for p, pod in self.pods.items() if pod["metadata"]["labels"].get(L.LWS_NAME) == name}
            for pod_name, pod in mine.items():
                if int(pod["metadata"]["labels"][L.LWS_GROUP_INDEX]) >= replicas:
                    del self.pods[pod_name]
            for g in range(replicas):
                leader = self.pods.get(f"{name}-{g}")
                if leader is not None and (g < partition or leader["metadata"]["labels"].get(L.ENGINE_REV) == rev):
                    if ready:  # kept: settled means every pod of the group ready
                        for w in range(size):
                            self.pods[f"{name}-{g}-{w}" if w else f"{name}-{g}"]["status"]["conditions"] = [
                                {"type": "Ready", "status": "True"}
                            ]
                    continue
                for w in range(size):  # the group is made, or replaced whole, from the template
                    template = lwt["leaderTemplate" if w == 0 else "workerTemplate"]
                    labels = {**template["metadata"]["labels"], L.LWS_NAME: name, L.LWS_GROUP_INDEX: str(g),
                              L.LWS_WORKER_INDEX: str(w)}  # fmt: skip
                    pod_name = f"{name}-{g}-{w}" if w else f"{name}-{g}"
                    self.pods[pod_name] = {
                        "metadata": {"name": pod_name, "labels": labels},
                        "spec": copy.deepcopy(template["spec"]),
                        "status": {
                            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                            "containerStatuses": [{"name": "engine", "restartCount": 0}],
                        },
                    }

    def set_pod(self, name: str, ready: bool | None = None, restarts: int | None = None,
                unschedulable: bool = False) -> None:  # fmt: skip
        """Change one simulated pod's readiness, restart count or scheduling."""
        status = self.pods[name]["status"]
        if ready is not None:
            status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        if restarts is not None:
            status["containerStatuses"][0]["restartCount"] = restarts
        if unschedulable:
            status["conditions"] = [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
            ]


def progressing(kube: FakeKube, field: str = "reason") -> str:
    """The deployment's Progressing condition: its reason (or another field, e.g. message)."""
    assert kube.dd is not None
    return str(next(c[field] for c in kube.dd["status"]["conditions"] if c["type"] == C.PROGRESSING))


def replicas(kube: FakeKube) -> dict[tuple[str, str, str], bool]:
    """(role, replica, engine revision) -> ready: a LeaderWorkerSet group ready only when every one of its pods is,
    a StatefulSet pod its own replica."""
    out: dict[tuple[str, str, str], bool] = {}
    for name, pod in kube.pods.items():
        labels = pod["metadata"]["labels"]
        replica = labels.get(L.LWS_GROUP_INDEX, name)
        key = (labels[L.ROLE], replica, labels[L.ENGINE_REV])
        out[key] = out.get(key, True) and pod["status"]["conditions"][0]["status"] == "True"
    return out


def pairable(kube: FakeKube) -> int:
    """Ready replicas of the scarcer pool, summed over engine revisions: the pairs the router has now."""
    by_rev: dict[str, dict[str, int]] = {}
    for (role, _, rev), ready in replicas(kube).items():
        roles = by_rev.setdefault(rev, {"prefill": 0, "decode": 0})
        roles[role] += int(ready)
    return sum(min(roles.values()) for roles in by_rev.values())


async def walk_roll(
    kube: FakeKube, reconcile: Callable[[FakeKube], Awaitable[object]],
    look: Callable[[FakeKube], None] | None = None, limit: int = 20,
) -> tuple[list[int], list[str]]:  # fmt: skip
    """Reconcile an engine change through to Complete: at each step the controllers act (new and replaced pods not
    ready yet), the pairs are counted (and `look` sees the state), then everything settles ready. Returns the
    pairable replicas and the Progressing reasons, one per step."""
    pairs: list[int] = []
    reasons: list[str] = []
    passes = 0
    while progressing(kube) != "Complete" or passes == 0:
        passes += 1
        assert passes < limit, reasons
        await reconcile(kube)
        reasons.append(progressing(kube))
        kube.settle(ready=False)
        pairs.append(pairable(kube))
        if look is not None:
            look(kube)
        kube.settle()
        await reconcile(kube)
    return pairs, reasons
