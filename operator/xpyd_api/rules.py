"""Cross-field rules, written once as CEL for the API server and mirrored in Python for the operator."""

from __future__ import annotations

from typing import Final

from xpyd_perf.topology import OFFERED, TOPOLOGIES

MAX_NAME_LENGTH: Final = 40
# The kinds spec.topology.kind takes: the topology table's deployable entries, and Any.
TOPOLOGY_KINDS: Final[tuple[str, ...]] = (*OFFERED, "Any")
# The most GPUs any replica may take: the largest NVLink domain of a deployable kind.
MAX_REPLICA_GPUS: Final = max(TOPOLOGIES[k].max_replica_gpus for k in OFFERED)
# Kinds whose NVLink ends at the node: a replica (one pod) must fit one node's GPUs.
_NODE_LIMITS: Final = {k: TOPOLOGIES[k].max_replica_gpus for k in OFFERED if TOPOLOGIES[k].nvlink_domain == "node"}


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _pool_gpu_rule(pool: str, kind: str, limit: int) -> dict[str, str]:
    return _rule(
        f"self.topology.kind != '{kind}' || !has(self.{pool}) || self.{pool}.gpusPerReplica <= {limit}",
        f"{pool}.gpusPerReplica must be <= {limit} on {kind}: a replica must fit in one node ({limit} GPUs)",
        f".{pool}.gpusPerReplica",
    )


ROOT_RULES: Final[list[dict[str, str]]] = [
    _rule(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: pods are named <name>-prefill-<n>",
    ),
]

SPEC_RULES: Final[list[dict[str, str]]] = [
    _rule(
        "self.mode != 'Colocated' || !has(self.decode)",
        "decode must be omitted in Colocated mode: put the single pool under spec.worker",
        ".decode",
    ),
    _rule(
        "self.mode != 'Colocated' || !has(self.prefill)",
        "prefill must be omitted in Colocated mode: put the single pool under spec.worker",
        ".prefill",
    ),
    _rule("self.mode != 'Colocated' || has(self.worker)", "worker is required in Colocated mode", ".worker"),
    _rule(
        "self.mode != 'Disaggregated' || (has(self.prefill) && has(self.decode))",
        "prefill and decode are both required in Disaggregated mode",
    ),
    _rule(
        "self.mode != 'Disaggregated' || !has(self.worker)",
        "worker is only for Colocated mode; use prefill and decode in Disaggregated mode",
        ".worker",
    ),
    *(
        _pool_gpu_rule(pool, kind, limit)
        for kind, limit in _NODE_LIMITS.items()
        for pool in ("prefill", "decode", "worker")
    ),
]

POOL_RULES: Final[dict[str, list[dict[str, str]]]] = {
    "autoscaling": [
        _rule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must be <= maxReplicas",
            ".minReplicas",
        )
    ],
    "pool": [
        _rule(
            "!has(self.replicas) || !has(self.autoscaling) || (self.replicas >= self.autoscaling.minReplicas"
            " && self.replicas <= self.autoscaling.maxReplicas)",
            "replicas must lie within autoscaling.minReplicas..maxReplicas",
            ".replicas",
        ),
        # One replica is one engine whose world size (tensor x data parallel) is its GPU count.
        _rule(
            "self.gpusPerReplica % self.dataParallelSize == 0",
            "gpusPerReplica must be a multiple of dataParallelSize (one replica = tensor x data parallel GPUs)",
            ".dataParallelSize",
        ),
        _rule(
            "!has(self.tensorParallelSize) || self.gpusPerReplica == 0"
            " || self.tensorParallelSize * self.dataParallelSize == self.gpusPerReplica",
            "tensorParallelSize x dataParallelSize (the engine's world size) must equal gpusPerReplica",
            ".tensorParallelSize",
        ),
    ],
}


class SpecError(ValueError):
    """A spec breaks a cross-field rule; the message names the field."""


def check_pool(replicas: int | None, bounds: tuple[int, int] | None) -> None:
    if bounds is None:
        return
    low, high = bounds
    if low > high:
        raise SpecError(f"autoscaling.minReplicas ({low}) must be <= maxReplicas ({high})")
    if replicas is not None and not low <= replicas <= high:
        raise SpecError(f"replicas ({replicas}) must lie within autoscaling bounds {low}..{high}")


def check_world(gpus: int, tp: int | None, dp: int) -> None:
    """Mirror of the pool's world-size rules: tensor x data parallel ranks use every GPU of the replica."""
    if gpus % dp:
        raise SpecError(f"gpusPerReplica ({gpus}) must be a multiple of dataParallelSize ({dp})")
    if tp is not None and gpus and tp * dp != gpus:
        raise SpecError(
            f"tensorParallelSize x dataParallelSize ({tp} x {dp}) is the engine's world size and must equal "
            f"gpusPerReplica ({gpus})"
        )


def check_spec(mode: str, topology: str, pool_gpus: dict[str, int]) -> None:
    """Mirror of SPEC_RULES; pool_gpus maps each present pool to its gpusPerReplica."""
    pools = set(pool_gpus)
    if mode == "Colocated" and pools != {"worker"}:
        raise SpecError("Colocated mode takes exactly one pool, spec.worker (no prefill or decode)")
    if mode == "Disaggregated" and pools != {"prefill", "decode"}:
        raise SpecError("Disaggregated mode takes spec.prefill and spec.decode (and no spec.worker)")
    limit = _NODE_LIMITS.get(topology)
    for pool, gpus in pool_gpus.items():
        if limit is not None and gpus > limit:
            raise SpecError(f"{pool}.gpusPerReplica ({gpus}) must be <= {limit} on {topology}")
