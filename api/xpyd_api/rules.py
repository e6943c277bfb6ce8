"""Cross-field rules, written once as CEL for the API server and mirrored in Python for the operator."""

from __future__ import annotations

from typing import Final

from xpyd_perf.topology import OFFERED, TOPOLOGIES

MAX_NAME_LENGTH: Final = 40
# The kinds spec.topology.kind takes: the topology table's deployable entries, and Any.
TOPOLOGY_KINDS: Final[tuple[str, ...]] = (*OFFERED, "Any")
# The most GPUs any replica may take: 32 HGX nodes (the seeds' widest decode spans 18 nodes, 144 GPUs).
MAX_REPLICA_GPUS: Final = 256
# Per deployable kind: GPUs per node (a replica larger than a node takes whole nodes, one pod each) and,
# where NVLink spans a rack, the most GPUs a replica may take so that it stays in one NVLink domain.
_NODE_GPUS: Final = {k: TOPOLOGIES[k].gpus_per_node for k in OFFERED}
_DOMAIN_LIMITS: Final = {k: TOPOLOGIES[k].domain_gpus for k in OFFERED if TOPOLOGIES[k].nvlink_domain == "clique"}


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _pool_layout_rules(pool: str, kind: str, node: int) -> list[dict[str, str]]:
    """A replica larger than one node takes whole nodes; each pod holds whole data-parallel ranks;
    on a rack-scale kind the replica stays inside one NVLink domain."""
    on, g = f"self.topology.kind != '{kind}' || !has(self.{pool})", f"self.{pool}.gpusPerReplica"
    rules = [
        _rule(
            f"{on} || {g} <= {node} || {g} % {node} == 0",
            f"{pool}.gpusPerReplica must be <= {node} or a multiple of {node} on {kind}: "
            f"a replica larger than one node takes whole nodes ({node} GPUs each)",
            f".{pool}.gpusPerReplica",
        ),
        _rule(
            f"{on} || {g} <= {node} || self.{pool}.dataParallelSize == 1"
            f" || self.{pool}.dataParallelSize % ({g} / {node}) == 0",
            f"{pool}.dataParallelSize must be 1 or a multiple of the replica's nodes ({pool}.gpusPerReplica / {node})"
            f" on {kind}: a data-parallel rank never spans nodes",
            f".{pool}.dataParallelSize",
        ),
    ]
    if (limit := _DOMAIN_LIMITS.get(kind)) is not None:
        rules.append(
            _rule(
                f"{on} || {g} <= {limit}",
                f"{pool}.gpusPerReplica must be <= {limit} on {kind}: a replica stays inside one NVLink domain (rack)",
                f".{pool}.gpusPerReplica",
            )
        )
    return rules


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
        rule
        for kind, node in _NODE_GPUS.items()
        for pool in ("prefill", "decode", "worker")
        for rule in _pool_layout_rules(pool, kind, node)
    ),
]

# --kv-transfer-config keys the operator writes itself (the connector, the pool's role in the handoff).
OWN_KV_TRANSFER_KEYS: Final = ("kv_connector", "kv_role")
POOL_RULES: Final[dict[str, list[dict[str, str]]]] = {
    "engine": [
        _rule(
            "self.kind != 'sglang' || !has(self.kvTransferConfig) || size(self.kvTransferConfig) == 0",
            "kvTransferConfig is vLLM's --kv-transfer-config; SGLang's transfer flags go in engine.args",
            ".kvTransferConfig",
        ),
        _rule(
            "!has(self.kvTransferConfig) || "
            + " && ".join(f"!('{k}' in self.kvTransferConfig)" for k in OWN_KV_TRANSFER_KEYS),
            "kvTransferConfig may not set kv_connector or kv_role: the operator writes them (engine.kvConnector,"
            " and each pool's role)",
            ".kvTransferConfig",
        ),
    ],
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
            "self.gpusPerReplica % (self.dataParallelSize * self.pipelineParallelSize) == 0",
            "gpusPerReplica must be a multiple of dataParallelSize x pipelineParallelSize"
            " (one replica = tensor x pipeline x data parallel GPUs)",
            ".dataParallelSize",
        ),
        _rule(
            "!has(self.tensorParallelSize) || self.gpusPerReplica == 0"
            " || self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize == self.gpusPerReplica",
            "tensorParallelSize x pipelineParallelSize x dataParallelSize (the engine's world size) must equal"
            " gpusPerReplica",
            ".tensorParallelSize",
        ),
        _rule(
            "self.pipelineParallelSize == 1 || self.dataParallelSize == 1",
            "pipelineParallelSize and dataParallelSize cannot both exceed 1: use one of them",
            ".pipelineParallelSize",
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


def check_world(gpus: int, tp: int | None, dp: int, pp: int = 1) -> None:
    """Mirror of the pool's world-size rules: tensor x pipeline x data parallel ranks use every GPU."""
    if pp > 1 and dp > 1:
        raise SpecError(f"pipelineParallelSize ({pp}) and dataParallelSize ({dp}) cannot both exceed 1: use one")
    if gpus % (dp * pp):
        raise SpecError(
            f"gpusPerReplica ({gpus}) must be a multiple of dataParallelSize x pipelineParallelSize ({dp * pp})"
        )
    if tp is not None and gpus and tp * pp * dp != gpus:
        raise SpecError(
            f"tensorParallelSize x pipelineParallelSize x dataParallelSize ({tp} x {pp} x {dp}) is the engine's "
            f"world size and must equal gpusPerReplica ({gpus})"
        )


def check_spec(mode: str, topology: str, pool_gpus: dict[str, tuple[int, int]]) -> None:
    """Mirror of SPEC_RULES; pool_gpus maps each present pool to (gpusPerReplica, dataParallelSize)."""
    pools = set(pool_gpus)
    if mode == "Colocated" and pools != {"worker"}:
        raise SpecError("Colocated mode takes exactly one pool, spec.worker (no prefill or decode)")
    if mode == "Disaggregated" and pools != {"prefill", "decode"}:
        raise SpecError("Disaggregated mode takes spec.prefill and spec.decode (and no spec.worker)")
    node, limit = _NODE_GPUS.get(topology), _DOMAIN_LIMITS.get(topology)
    for pool, (gpus, dp) in pool_gpus.items():
        if node is None or gpus <= node:
            continue
        if gpus % node:
            raise SpecError(
                f"{pool}.gpusPerReplica ({gpus}) must be <= {node} or a multiple of {node} on {topology}: "
                f"a replica larger than one node takes whole nodes"
            )
        if dp > 1 and dp % (gpus // node):
            raise SpecError(
                f"{pool}.dataParallelSize ({dp}) must be 1 or a multiple of the replica's {gpus // node} nodes "
                f"on {topology}: a data-parallel rank never spans nodes"
            )
        if limit is not None and gpus > limit:
            raise SpecError(
                f"{pool}.gpusPerReplica ({gpus}) must be <= {limit} on {topology}: "
                "a replica stays inside one NVLink domain (rack)"
            )


def check_engine(kind: str, kv_transfer_config: dict[str, str]) -> None:
    """Mirror of POOL_RULES["engine"]."""
    if kind == "sglang" and kv_transfer_config:
        raise SpecError("kvTransferConfig is vLLM's --kv-transfer-config; SGLang's transfer flags go in engine.args")
    if own := [k for k in OWN_KV_TRANSFER_KEYS if k in kv_transfer_config]:
        raise SpecError(
            f"kvTransferConfig may not set {', '.join(own)}: the operator writes them (engine.kvConnector, and"
            " each pool's role)"
        )
