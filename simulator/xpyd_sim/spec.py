"""Reads the DisaggregatedDeployment YAML kubectl takes and resolves it against the hardware catalogs.

The simulation keeps the typed spec (`SimSpec.deployment`) and reads every field from it, so what
the operator would do with a field is what the simulator does: pool sizes and shapes, the router's
policy and replicas, and all of `spec.autoscaling` through the operator's own translation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from xpyd_api.labels import GROUP, KIND, VERSION
from xpyd_api.models import ANY_TOPOLOGY, DisaggregatedDeployment, DisaggregatedDeploymentSpec, PoolAutoscaling
from xpyd_perf import ModelSpec, Topology, resolve_gpu, resolve_model, resolve_topology

DEFAULT_TOPOLOGY = "HGX-B200"  # what "Any" is simulated on unless --topology says otherwise


class SpecError(ValueError):
    """A spec file the simulator cannot use, with the reason."""


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool's starting size and replica shape (its bounds stay in the typed spec)."""

    role: str
    replicas: int
    gpus: int
    tp: int


def _plans(deployment: DisaggregatedDeploymentSpec) -> dict[str, PoolPlan]:
    out = {}
    for role, pool in deployment.pools().items():
        low = pool.autoscaling.min_replicas if pool.autoscaling else 1
        start = pool.replicas if pool.replicas is not None else max(low, 1)
        out[role] = PoolPlan(role, start, max(1, pool.gpus_per_replica), pool.tp)
    return out


@dataclass(frozen=True)
class SimSpec:
    """A deployment to simulate: the typed spec, the model and the hardware it runs on."""

    name: str
    deployment: DisaggregatedDeploymentSpec
    model: ModelSpec
    topology: Topology
    pools: dict[str, PoolPlan]

    @classmethod
    def of(cls, name: str, deployment: DisaggregatedDeploymentSpec, model: ModelSpec, topology: Topology) -> SimSpec:
        return cls(name, deployment, model, topology, _plans(deployment))

    @property
    def mode(self) -> str:
        return self.deployment.mode

    @property
    def kv_bytes_per_token(self) -> int | None:
        return self.deployment.model.kv_bytes_per_token

    @property
    def interval_s(self) -> float:
        return float(self.deployment.autoscaling.interval_seconds)

    @property
    def gpus(self) -> int:
        return sum(p.replicas * p.gpus for p in self.pools.values())

    @property
    def label(self) -> str:
        if self.mode == "Colocated":
            return f"{self.pools['worker'].replicas}W"
        return f"{self.pools['prefill'].replicas}P{self.pools['decode'].replicas}D"

    def with_deployment(self, deployment: DisaggregatedDeploymentSpec) -> SimSpec:
        return replace(self, deployment=deployment, pools=_plans(deployment))

    def with_pools(self, **sizes: int) -> SimSpec:
        """The same deployment with some pools resized (their autoscaling bounds widened to fit)."""
        update = {}
        for role, n in sizes.items():
            pool = self.deployment.pools()[role]
            bounds = pool.autoscaling
            if bounds is not None:
                low, high = min(bounds.min_replicas, n), max(bounds.max_replicas, n)
                bounds = PoolAutoscaling(min_replicas=low, max_replicas=high)
            update[role] = pool.model_copy(update={"replicas": n, "autoscaling": bounds})
        return self.with_deployment(self.deployment.model_copy(update=update))


def _topology(kind: str, override: str | None, gpu: str | None) -> Topology:
    try:
        topo = resolve_topology(override or (DEFAULT_TOPOLOGY if kind == ANY_TOPOLOGY else kind))
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
    name = str(dd.metadata.get("name", "unnamed"))
    return SimSpec.of(name, spec, model, _topology(spec.topology.kind, topology, gpu))


def load(path: Path, topology: str | None = None, gpu: str | None = None) -> SimSpec:
    """Read and resolve a spec file; the first DisaggregatedDeployment in a multi-document file."""
    if not path.is_file():
        raise SpecError(f"spec file {path} does not exist")
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from exc
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            return parse(doc, topology, gpu)
    raise SpecError(f"{path}: no {KIND} object in the file")
