"""Reads the DisaggregatedDeployment YAML kubectl takes and resolves it against the hardware catalogs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from xpyd_api.labels import GROUP, KIND, VERSION
from xpyd_api.models import DisaggregatedDeployment
from xpyd_perf import ModelSpec, Topology, resolve_gpu, resolve_model, resolve_topology

DEFAULT_TOPOLOGY = "HGX-B200"  # what "Any" is simulated on unless --topology says otherwise


class SpecError(ValueError):
    """A spec file the simulator cannot use, with the reason."""


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool: start size, replica shape and the autoscaler's bounds."""

    role: str
    replicas: int
    gpus: int
    tp: int
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True, slots=True)
class SimSpec:
    """Everything of a deployment the simulator uses, resolved."""

    name: str
    model: ModelSpec
    kv_bytes_per_token: int | None
    topology: Topology
    mode: str  # "Disaggregated" | "Colocated"
    pools: dict[str, PoolPlan]
    router_policy: str
    router_replicas: int
    autoscaling: bool
    interval_s: float

    @property
    def gpus(self) -> int:
        return sum(p.replicas * p.gpus for p in self.pools.values())

    @property
    def label(self) -> str:
        if self.mode == "Colocated":
            return f"{self.pools['worker'].replicas}W"
        return f"{self.pools['prefill'].replicas}P{self.pools['decode'].replicas}D"

    def with_pools(self, **sizes: int) -> SimSpec:
        """The same deployment with some pools resized (their bounds widened to fit)."""
        pools = dict(self.pools)
        for role, n in sizes.items():
            p = pools[role]
            pools[role] = replace(
                p, replicas=n, min_replicas=min(p.min_replicas, n), max_replicas=max(p.max_replicas, n)
            )
        return replace(self, pools=pools)


def _topology(kind: str, override: str | None, gpu: str | None) -> Topology:
    try:
        topo = resolve_topology(override or (DEFAULT_TOPOLOGY if kind == "Any" else kind))
        return replace(topo, gpu=resolve_gpu(gpu)) if gpu else topo
    except ValueError as exc:
        raise SpecError(str(exc)) from exc


def parse(doc: Any, topology: str | None = None, gpu: str | None = None) -> SimSpec:
    """A SimSpec from a parsed YAML document (validated by the API's own pydantic models)."""
    if not isinstance(doc, dict):
        raise SpecError("spec must be a YAML mapping (a DisaggregatedDeployment object)")
    want = f"{GROUP}/{VERSION}"
    if doc.get("apiVersion") != want or doc.get("kind") != KIND:
        raise SpecError(
            f"spec must have apiVersion {want} and kind {KIND}, got {doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    try:
        dd = DisaggregatedDeployment.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(f"invalid DisaggregatedDeployment: {exc}") from exc
    spec = dd.spec
    try:
        model = resolve_model(spec.model.name)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    pools: dict[str, PoolPlan] = {}
    for role, pool in spec.pools().items():
        bounds = pool.autoscaling
        lo = bounds.min_replicas if bounds else (pool.replicas or 1)
        hi = bounds.max_replicas if bounds else (pool.replicas or 1)
        start = pool.replicas if pool.replicas is not None else max(lo, 1)
        gpus = max(1, pool.gpus_per_replica)
        pools[role] = PoolPlan(role, start, gpus, pool.tp, min(lo, start), max(hi, start))
    need = {"worker"} if spec.mode == "Colocated" else {"prefill", "decode"}
    if set(pools) != need:
        raise SpecError(f"mode {spec.mode} needs pools {sorted(need)}, the spec has {sorted(pools)}")
    return SimSpec(
        name=str(dd.metadata.get("name", "unnamed")),
        model=model,
        kv_bytes_per_token=spec.model.kv_bytes_per_token,
        topology=_topology(spec.topology.kind, topology, gpu),
        mode=spec.mode,
        pools=pools,
        router_policy=spec.router.policy,
        router_replicas=max(1, spec.router.replicas),
        autoscaling=spec.autoscaling.enabled,
        interval_s=float(spec.autoscaling.interval_seconds),
    )


def load(path: Path, topology: str | None = None, gpu: str | None = None) -> SimSpec:
    """Read and resolve a spec file; the first DisaggregatedDeployment in a multi-document file."""
    if not path.is_file():
        raise SpecError(f"spec file {path} does not exist")
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            return parse(doc, topology, gpu)
    raise SpecError(f"{path}: no {KIND} object in the file")
