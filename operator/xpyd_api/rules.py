"""Cross-field rules, written once as CEL for the API server and mirrored in Python for the operator."""

from __future__ import annotations

from typing import Final

HGX_GPUS_PER_NODE: Final = 8
MAX_NAME_LENGTH: Final = 40


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _pool_gpu_rule(pool: str) -> dict[str, str]:
    return _rule(
        f"self.topology.kind != 'HGX-B200' || !has(self.{pool}) || self.{pool}.gpusPerReplica <= 8",
        f"{pool}.gpusPerReplica must be <= 8 on HGX-B200: a replica must fit in one node (8 GPUs)",
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
    _pool_gpu_rule("prefill"),
    _pool_gpu_rule("decode"),
    _pool_gpu_rule("worker"),
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
        )
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


def check_spec(mode: str, topology: str, pool_gpus: dict[str, int]) -> None:
    """Mirror of SPEC_RULES; pool_gpus maps each present pool to its gpusPerReplica."""
    pools = set(pool_gpus)
    if mode == "Colocated" and pools != {"worker"}:
        raise SpecError("Colocated mode takes exactly one pool, spec.worker (no prefill or decode)")
    if mode == "Disaggregated" and pools != {"prefill", "decode"}:
        raise SpecError("Disaggregated mode takes spec.prefill and spec.decode (and no spec.worker)")
    for pool, gpus in pool_gpus.items():
        if topology == "HGX-B200" and gpus > HGX_GPUS_PER_NODE:
            raise SpecError(f"{pool}.gpusPerReplica ({gpus}) must be <= 8 on HGX-B200")
