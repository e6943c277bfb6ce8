"""Reads the DisaggregatedDeployment YAML kubectl takes and resolves it against the hardware catalogs.

The simulation keeps the typed spec (`SimSpec.deployment`) and reads every field from it, so what
the operator would do with a field is what the simulator does: pool sizes and shapes, the router's
policy and replicas, and all of `spec.autoscaling` through the operator's own translation. A spec
the operator would refuse because a replica does not fit its GPUs is refused with the operator's
own message (xpyd_operator.sizing, condition Ready=False, reason ReplicaDoesNotFit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from xpyd_api.labels import GROUP, KIND, VERSION
from xpyd_api.models import (
    ANY_TOPOLOGY,
    DisaggregatedDeployment,
    DisaggregatedDeploymentSpec,
    PoolAutoscaling,
    PoolSpec,
)
from xpyd_operator import sizing
from xpyd_perf import Fit, ModelSpec, Topology, replica_fit, resolve_gpu, resolve_model, resolve_topology
from xpyd_perf.fits import layout_problem

DEFAULT_TOPOLOGY = "HGX-B200"  # what "Any" is simulated on unless --topology says otherwise


class SpecError(ValueError):
    """A spec file the simulator cannot use, with the reason."""


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool's starting size and replica shape (its bounds stay in the typed spec).

    A replica is one engine of `gpus` GPUs, whatever pods it takes: a multi-node replica (a
    LeaderWorkerSet group) is simulated as one replica of all its GPUs. `dp` is its data-parallel
    ranks (vLLM `--data-parallel-size`), each with its own prefix cache (xpyd_sim.worker).
    """

    role: str
    replicas: int
    gpus: int
    tp: int
    expert_parallel: bool = False
    dp: int = 1
    offload_bytes: int = 0  # host memory a replica keeps KV in (its CPU tier; 0: none)


def _plans(deployment: DisaggregatedDeploymentSpec) -> dict[str, PoolPlan]:
    out = {}
    for role, pool in deployment.pools().items():
        low = pool.autoscaling.min_replicas if pool.autoscaling else 1
        start = pool.replicas if pool.replicas is not None else max(low, 1)
        out[role] = PoolPlan(
            role,
            start,
            max(1, pool.gpus_per_replica),
            pool.tp,
            pool.expert_parallel,
            max(1, pool.data_parallel_size),
            offload_bytes=pool.kv_offload.cpu_bytes if pool.kv_offload is not None else 0,
        )
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


def _fit_on(deployment: DisaggregatedDeploymentSpec, pool: PoolSpec, topology: Topology) -> Fit | None:
    """The operator's fits-check (xpyd_operator.sizing.replica_fit_of) on the simulated hardware."""
    if deployment.topology.hardware == topology:
        return sizing.replica_fit_of(deployment, pool)  # the operator's own check, word for word
    model = sizing.catalog_model(deployment, pool)
    if model is None or pool.gpus_per_replica < 1:
        return None
    flags = sizing.engine_flags(deployment, pool)
    per_token = deployment.model.kv_bytes_per_token or model.kv_bytes_per_token
    if flags.fp8_kv_cache:
        per_token = max(1, per_token // 2)
    return replica_fit(
        model, topology.gpu, pool.tp, pool.data_parallel_size, pool.expert_parallel, flags.max_model_len,
        per_token, flags.memory_utilization,
    )  # fmt: skip


def replica_fits(spec: SimSpec) -> dict[str, Fit]:
    """Each pool's fits-check on the hardware the simulation runs (pools it cannot model are left out)."""
    out = {}
    for role, pool in spec.deployment.pools().items():
        fit = _fit_on(spec.deployment, pool, spec.topology)
        if fit is not None:
            out[role] = fit
    return out


def check_replicas(spec: SimSpec) -> SimSpec:
    """Refuses what the operator refuses: a replica its topology cannot hold as a whole group of nodes,
    or one whose GPUs cannot hold the weights and one longest sequence (Ready=False, ReplicaDoesNotFit)."""
    for role, pool in spec.deployment.pools().items():
        if problem := layout_problem(spec.topology, pool.gpus_per_replica, pool.data_parallel_size):
            raise SpecError(f"{spec.name}: {role}.{problem}")
    for role, fit in replica_fits(spec).items():
        if not fit.fits:
            raise SpecError(
                f"{spec.name}: the operator would refuse it (Ready=False, ReplicaDoesNotFit): {role}: {fit.summary()}"
            )
    return spec


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
        model = sizing.declared_model(spec) or resolve_model(spec.model.name)  # an inline spec.model.config too
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    name = str(dd.metadata.get("name", "unnamed"))
    return check_replicas(SimSpec.of(name, spec, model, _topology(spec.topology.kind, topology, gpu)))


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
