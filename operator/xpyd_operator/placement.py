"""Where the pools go (docs/architecture.md, Reconcile): a pure function of observed nodes, pods and reservations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from xpyd_api import labels
from xpyd_perf import Topology


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    gpus: int  # allocatable nvidia.com/gpu
    schedulable: bool = True


@dataclass(frozen=True)
class PodInfo:
    node: str
    gpus: int
    deployment: str | None = None  # "<namespace>/<name>" of the xpyd deployment owning it
    domain: str | None = None  # its xpyd.io/nvlink-domain label


@dataclass(frozen=True)
class Reservation:
    """GPUs another xpyd deployment's StatefulSet pins to a clique (counted before its pods bind)."""

    deployment: str
    clique: str
    gpus: int


@dataclass(frozen=True)
class Demand:
    role: str
    replicas: int
    gpus_per_replica: int
    tp: int
    pods_per_replica: int = 1  # > 1: a LeaderWorkerSet group of whole nodes

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus_per_replica // max(1, self.pods_per_replica)


@dataclass(frozen=True)
class Placement:
    node_selector: dict[str, str]
    pins: dict[str, str | None]  # role -> clique it is pinned to (rack-scale systems), None when unpinned
    satisfied: bool
    reason: str
    message: str
    kv_path: str  # NVLink | RDMA | Local | Unknown
    cliques: list[str] = field(default_factory=list)


def node_selector(topology: Topology | None) -> dict[str, str]:
    """The node selector of a topology's pods; none for Any."""
    return topology.node_selector() if topology is not None else {}


def eligible(nodes: Iterable[NodeInfo], topology: Topology | None) -> list[NodeInfo]:
    wanted = node_selector(topology)
    return [n for n in nodes if n.schedulable and all(n.labels.get(k) == v for k, v in wanted.items())]


def unschedulable_reason(nodes: Iterable[NodeInfo], topology: Topology | None, demands: Iterable[Demand]) -> str | None:
    """Why no node can ever hold one replica of some pool, or None when every pool fits somewhere."""
    pool = eligible(nodes, topology)
    biggest = max((n.gpus for n in pool), default=0)
    where = f"{topology.name} nodes" if topology is not None else "nodes"
    for d in demands:
        if d.gpus_per_pod > biggest:
            return (
                f"{d.role}.gpusPerReplica={d.gpus_per_replica} fits no node: the largest of "
                f"{len(pool)} schedulable {where} has {biggest} allocatable GPUs"
            )
        if d.pods_per_replica > 1:
            room = _group_room(pool, d.gpus_per_pod, topology)
            if room < d.pods_per_replica:
                rack = topology is not None and topology.nvlink_domain == "clique"
                scope = "one NVLink clique" if rack else "the cluster"
                return (
                    f"{d.role}.gpusPerReplica={d.gpus_per_replica} spans {d.pods_per_replica} nodes of "
                    f"{d.gpus_per_pod} GPUs, but {scope} has only {room} such schedulable {where}"
                )
    return None


def _group_room(pool: list[NodeInfo], gpus_per_pod: int, topology: Topology | None) -> int:
    """How many pods of one group can land together: in the largest clique on rack-scale systems."""
    big = [n for n in pool if n.gpus >= gpus_per_pod]
    if topology is None or topology.nvlink_domain != "clique":
        return len(big)
    per_clique: dict[str, int] = {}
    for n in big:
        clique = n.labels.get(labels.GPU_CLIQUE, "")
        per_clique[clique] = per_clique.get(clique, 0) + 1
    return max(per_clique.values(), default=0)


def free_by_clique(
    nodes: Iterable[NodeInfo], pods: Iterable[PodInfo], reservations: Iterable[Reservation], me: str
) -> dict[str, int]:
    """Free GPUs per clique (one NVLink domain of a rack), not counting what deployment `me` already holds."""
    clique_of = {n.name: n.labels[labels.GPU_CLIQUE] for n in nodes if labels.GPU_CLIQUE in n.labels}
    free: dict[str, int] = {}
    for n in nodes:
        if n.name in clique_of and n.schedulable:
            free[clique_of[n.name]] = free.get(clique_of[n.name], 0) + n.gpus
    reserved = {(r.deployment, r.clique) for r in reservations}
    for p in pods:
        clique = clique_of.get(p.node)
        if clique is None or clique not in free or p.deployment == me:
            continue
        if p.deployment is not None and (p.deployment, clique) in reserved and p.domain == clique:
            continue  # counted through its reservation below
        free[clique] -= p.gpus
    for r in reservations:
        if r.deployment != me and r.clique in free:
            free[r.clique] -= r.gpus
    return free


def _best_fit(free: Mapping[str, int], need: int) -> str | None:
    fits = [(room, name) for name, room in free.items() if room >= need]
    return min(fits)[1] if fits else None


def place_in_cliques(
    topology: Topology, free: Mapping[str, int], demands: list[Demand], current: Mapping[str, str | None]
) -> Placement:
    """Rack-scale systems: the whole unit in one clique when it fits, else each pool where it fits."""
    sel = topology.node_selector()
    unit = sum(d.gpus for d in demands)
    now = {current.get(d.role) for d in demands}
    kept = next(iter(now)) if len(now) == 1 else None
    clique = kept if kept is not None and free.get(kept, -1) >= unit else _best_fit(free, unit)
    if clique is not None:
        return Placement(
            sel,
            {d.role: clique for d in demands},
            True,
            "OneRack",
            f"all {unit} GPUs in clique {clique}; the KV handoff stays on NVLink",
            "NVLink" if len(demands) > 1 else "Local",
            [clique],
        )
    room = dict(free)
    pins: dict[str, str | None] = {}
    notes = []
    for d in sorted(demands, key=lambda d: (-d.gpus, d.role)):
        here = current.get(d.role)
        pick = here if here is not None and room.get(here, -1) >= d.gpus else _best_fit(room, d.gpus)
        pins[d.role] = pick
        if pick is None:
            each = "; each group stays inside one clique" if d.pods_per_replica > 1 else ""
            spread = f"fits no single rack and spreads over {topology.gpu.name} nodes{each}"
            notes.append(f"{d.role} ({d.gpus} GPUs) {spread}")
        else:
            room[pick] -= d.gpus
            notes.append(f"{d.role} ({d.gpus} GPUs) in clique {pick}")
    message = f"the unit needs {unit} GPUs and no clique has that many free; " + "; ".join(notes)
    used = sorted({c for c in pins.values() if c is not None})
    return Placement(sel, pins, False, "SpansRacks", message + "; the KV handoff crosses racks over RDMA", "RDMA", used)


def place(
    topology: Topology | None,
    demands: list[Demand],
    free: Mapping[str, int] | None = None,
    current: Mapping[str, str | None] | None = None,
) -> Placement:
    """The placement for one deployment; `free` (from free_by_clique) is needed on rack-scale systems only."""
    sel = node_selector(topology)
    pins: dict[str, str | None] = {d.role: None for d in demands}
    single = len(demands) == 1
    if topology is not None and topology.nvlink_domain == "clique":
        return place_in_cliques(topology, free or {}, demands, current or {})
    if topology is not None:
        tps = {d.role: d.tp for d in demands}
        if len(set(tps.values())) > 1:
            sizes = ",".join(f"{role} tp={tp}" for role, tp in sorted(tps.items()))
            msg = f"tensor-parallel sizes differ ({sizes}): KV handoff slices leave their rail"
            return Placement(sel, pins, False, "TensorParallelMismatch", msg, "RDMA")
        wide = [d for d in demands if d.pods_per_replica > 1]
        msg = f"replicas stay within one {topology.gpu.name} node; the KV handoff crosses the node's NICs rail by rail"
        if wide:
            spans = ", ".join(f"{d.role} {d.pods_per_replica} nodes" for d in wide)
            msg = f"multi-node replicas ({spans}) on {topology.gpu.name} nodes; KV handoffs cross NICs rail by rail"
        return Placement(sel, pins, True, "OneNodePerReplica", msg, "Local" if single else "RDMA")
    return Placement(sel, pins, True, "NoTopology", "topology Any pins nothing", "Local" if single else "Unknown")
