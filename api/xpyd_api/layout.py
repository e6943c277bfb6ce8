"""How one replica lays out over pods: one pod per replica, or a LeaderWorkerSet group of whole nodes.

A replica (one engine instance) of G GPUs on a system whose nodes hold g GPUs is one pod when
G <= g, else a group of G / g pods, one per node (docs/configure.md, "Multi-node replicas"). Its parallelism is
tensor x pipeline x data parallel = G; data-parallel ranks never span pods, so each pod of a
multi-node replica with data parallelism holds dp / pods whole ranks. Pure: the API's rules, the
operator's builders, the router and the simulator all ask this one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

WorkloadKind = Literal["StatefulSet", "LeaderWorkerSet"]
STATEFULSET: Final = "StatefulSet"
LEADERWORKERSET: Final = "LeaderWorkerSet"


@dataclass(frozen=True, slots=True)
class ReplicaLayout:
    """One replica: its GPUs, pods, and tensor / pipeline / data-parallel sizes."""

    gpus: int
    pods: int
    tp: int
    pp: int
    dp: int
    expert_parallel: bool

    @property
    def multi_node(self) -> bool:
        return self.pods > 1

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus // self.pods if self.pods else 0

    @property
    def dp_local(self) -> int:
        """Data-parallel ranks each pod runs (vLLM --data-parallel-size-local)."""
        return max(1, self.dp // self.pods)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def workload_kind(self) -> WorkloadKind:
        return LEADERWORKERSET if self.multi_node else STATEFULSET

    def describe(self) -> str:
        """E.g. '32 GPUs as 4 pods x 8 (TP1 x DP32, EP)'."""
        parallel = f"TP{self.tp}" + (f" x PP{self.pp}" if self.pp > 1 else "")
        parallel += f" x DP{self.dp}" if self.dp > 1 else ""
        ep = ", EP" if self.expert_parallel else ""
        pods = f"{self.pods} pods x {self.gpus_per_pod}" if self.multi_node else "1 pod"
        return f"{self.gpus} GPUs as {pods} ({parallel}{ep})"


def pods_per_replica(gpus: int, gpus_per_node: int | None) -> int:
    """Pods of one replica: 1 when it fits one node (or the node size is unknown), else one per node."""
    if gpus_per_node is None or gpus_per_node < 1 or gpus <= gpus_per_node:
        return 1
    return -(-gpus // gpus_per_node)


def replica_layout(
    gpus: int, tp: int | None, pp: int, dp: int, expert_parallel: bool, gpus_per_node: int | None
) -> ReplicaLayout:
    """The layout of one replica; tp defaults to the GPUs left after pipeline and data parallel."""
    tensor = tp or max(1, gpus // max(1, pp * dp))
    return ReplicaLayout(gpus, pods_per_replica(gpus, gpus_per_node), tensor, pp, dp, expert_parallel)
