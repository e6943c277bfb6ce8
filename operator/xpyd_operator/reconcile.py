"""One level-based pass over a DisaggregatedDeployment: observe, compare, apply only the difference."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from xpyd_api import conditions as C
from xpyd_api.models import Condition, DisaggregatedDeploymentSpec, DisaggregatedDeploymentStatus
from xpyd_api.podmodels import NetworkSpec
from xpyd_http import hub
from xpyd_operator import opmetrics, sizing, statuscalc
from xpyd_operator.desired import (
    WORKLOADS,
    Desired,
    InputError,
    Observed,
    autoscaled,
    desire,
    needs_apply,
    obsolete,
    with_defaults,
    with_model_config,
)
from xpyd_operator.meta import Owner, default_own_image
from xpyd_operator.modelhub import HubSettings, ModelHub
from xpyd_operator.routerkit import MonitorSettings
from xpyd_perf import ModelConfigError, Topology, parse_json

log = logging.getLogger("xpyd.operator")
_EVENT_TYPES = (C.READY, C.TOPOLOGY_SATISFIED, C.DISAGGREGATION_WORTHWHILE, C.COMPUTE_DOMAIN)


class KubeApi(Protocol):
    """What the reconciler needs from the API server (kube.Kube in production, a fake in tests)."""

    async def get_dd(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def get_config_map(self, namespace: str, name: str) -> dict[str, str] | None: ...
    async def observe(self, owner: Owner, topology: Topology | None) -> Observed: ...
    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]: ...
    async def delete(self, kind: str, name: str, namespace: str) -> None: ...
    async def apply_status(self, owner: Owner, status: dict[str, Any]) -> None: ...
    async def event(self, owner: Owner, type_: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class Config:
    own_image: str = ""
    router_image: str = ""
    image_pull_secrets: tuple[str, ...] = ()  # for every pod the operator makes, in any namespace
    default_network: NetworkSpec | None = None  # for deployments without spec.network (--default-network)
    model_hub: HubSettings | None = None  # fetch config.json of models the spec and the catalog do not know
    router_monitor: MonitorSettings | None = None  # PodMonitors for TLS routers (--router-pod-monitor)

    def images(self) -> tuple[str, str]:
        own = self.own_image or default_own_image()
        return own, self.router_image or own


@dataclass
class Outcome:
    applied: list[str]
    deleted: list[str]
    status_written: bool


def _key(manifest: dict[str, Any]) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def transitions(old: list[Condition], new: list[Condition]) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for each watched condition whose status or reason changed."""
    before = {c.type: (c.status, c.reason) for c in old}
    out = []
    for c in new:
        if c.type in _EVENT_TYPES and before.get(c.type) != (c.status, c.reason):
            good = c.status == "True" or c.type == C.DISAGGREGATION_WORTHWHILE
            out.append(("Normal" if good else "Warning", c.reason, f"{c.type}={c.status}: {c.message}"))
    return out


class Reconciler:
    def __init__(self, kube: KubeApi, config: Config | None = None) -> None:
        self.kube = kube
        self.config = config or Config()
        self.placement_lock = asyncio.Lock()  # clique choices (rack-scale systems) are made one at a time
        self.model_hub = ModelHub(self.config.model_hub) if self.config.model_hub is not None else None

    async def reconcile(self, namespace: str, name: str) -> Outcome | None:
        with opmetrics.RECONCILE_SECONDS.time():
            try:
                outcome = await self._reconcile(namespace, name)
            except Exception:
                opmetrics.RECONCILES.labels(result="error").inc()
                raise
        result = "gone" if outcome is None else "changed" if outcome.applied or outcome.deleted else "unchanged"
        opmetrics.RECONCILES.labels(result=result).inc()
        return outcome

    async def _reconcile(self, namespace: str, name: str) -> Outcome | None:
        obj = await self.kube.get_dd(namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        owner = Owner(name, namespace, obj["metadata"]["uid"])
        generation = obj["metadata"].get("generation")
        old = DisaggregatedDeploymentStatus.read(obj.get("status"))
        try:
            spec = DisaggregatedDeploymentSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            return await self._invalid(owner, generation, old, exc)
        spec = with_defaults(autoscaled(spec, old.autoscaler), self.config.default_network)
        spec, problem = await self._model_config(owner, spec)
        topology = spec.topology.hardware
        if topology is not None and topology.nvlink_domain == "clique":
            async with self.placement_lock:
                return await self._converge(owner, generation, spec, old, problem)
        return await self._converge(owner, generation, spec, old, problem)

    async def _model_config(
        self, owner: Owner, spec: DisaggregatedDeploymentSpec
    ) -> tuple[DisaggregatedDeploymentSpec, tuple[str, str] | None]:
        """The spec with spec.model.configMap's config.json read in, or the reason it cannot be (re-read on every
        reconcile: the operator does not watch ConfigMaps, so an edit counts from the next event or resync)."""
        ref = spec.model.config_map
        if ref is None:
            return await self._hub_config(spec)
        where = f"ConfigMap {owner.namespace}/{ref.name}"
        try:
            data = await self.kube.get_config_map(owner.namespace, ref.name)
        except PermissionError as exc:
            return spec, (
                "ModelConfigInvalid",
                f"{where}: cannot read it ({exc}); the operator needs get on configmaps",
            )
        if data is None:
            hint = f"kubectl -n {owner.namespace} create configmap {ref.name} --from-file={ref.key}=<path>/config.json"
            return spec, ("ModelConfigInvalid", f"{where} (spec.model.configMap) not found; create it: {hint}")
        if ref.key not in data:
            keys = ", ".join(sorted(data)) or "none"
            return spec, ("ModelConfigInvalid", f"{where} has no key {ref.key!r} (its keys: {keys})")
        try:
            config = parse_json(data[ref.key], f"{where} key {ref.key}")
        except ModelConfigError as exc:
            return spec, ("ModelConfigInvalid", str(exc))
        return with_model_config(spec, config), None

    async def _hub_config(
        self, spec: DisaggregatedDeploymentSpec
    ) -> tuple[DisaggregatedDeploymentSpec, tuple[str, str] | None]:
        """The spec with the model's config.json from the hub read in, when the hub is on and nothing else gives
        the model's shape (else the spec as it is: desired.check_model refuses an unknown one, saying how)."""
        if self.model_hub is None or not sizing.unknown_shape(spec) or not hub.valid_repo(spec.model.name):
            return spec, None
        try:
            config = await self.model_hub.config(spec.model.name, sizing.model_revision(spec))
        except InputError as exc:  # ModelConfigUnavailable or ModelConfigInvalid, from modelhub
            return spec, (exc.reason, exc.message)
        return with_model_config(spec, config), None

    async def _converge(
        self,
        owner: Owner,
        generation: int | None,
        spec: DisaggregatedDeploymentSpec,
        old: DisaggregatedDeploymentStatus,
        problem: tuple[str, str] | None = None,
    ) -> Outcome:
        observed = await self.kube.observe(owner, spec.topology.hardware)
        own_image, router_image = self.config.images()
        desired: Desired = (
            desire(
                owner,
                spec,
                observed,
                own_image,
                router_image,
                self.config.image_pull_secrets,
                self.config.router_monitor,
            )
            if problem is None
            else Desired(None, [], problem)  # the spec's config.json is not readable: leave every child as it is
        )
        applied: list[str] = []
        deleted: list[str] = []
        if desired.error is None:
            todo = [m for m in desired.children if needs_apply(m, observed.children.get(_key(m)))]
            # Supporting objects first, then the workloads that use them; each phase in parallel.
            for phase in (False, True):
                batch = [m for m in todo if (m["kind"] in WORKLOADS) is phase]
                for manifest, result in zip(batch, await asyncio.gather(*map(self.kube.apply, batch)), strict=True):
                    observed.children[_key(manifest)] = result
                    applied.append("/".join(_key(manifest)))
            for kind, child in obsolete(desired.children, observed):
                await self.kube.delete(kind, child, owner.namespace)
                observed.children.pop((kind, child), None)
                deleted.append(f"{kind}/{child}")
        status = statuscalc.compute(owner, generation, spec, desired, observed, old.conditions, C.now_rfc3339())
        written = await self._write_status(owner, old, status)
        if applied:
            await self._event(owner, "Normal", "Applied", f"applied {', '.join(applied)}")
        if deleted:
            await self._event(owner, "Normal", "Pruned", f"deleted {', '.join(deleted)}")
        return Outcome(applied, deleted, written)

    async def _invalid(
        self, owner: Owner, generation: int | None, old: DisaggregatedDeploymentStatus, exc: ValidationError
    ) -> Outcome:
        problems = "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        msg = f"{problems}; running children left untouched"
        ready = C.make(C.READY, False, "InvalidSpec", msg, generation)
        conds = C.merge(old.conditions, [ready], C.now_rfc3339(), ())
        status = old.model_copy(update={"observed_generation": generation, "conditions": conds})
        return Outcome([], [], await self._write_status(owner, old, status))

    async def _write_status(
        self, owner: Owner, old: DisaggregatedDeploymentStatus, new: DisaggregatedDeploymentStatus
    ) -> bool:
        body = statuscalc.owned_view(new)
        if body == statuscalc.owned_view(old):
            return False
        await self.kube.apply_status(owner, body)
        for type_, reason, message in transitions(old.conditions, new.conditions):
            await self._event(owner, type_, reason, message)
        return True

    async def _event(self, owner: Owner, type_: str, reason: str, message: str) -> None:
        try:
            await self.kube.event(owner, type_, reason, message)
        except Exception as exc:  # events are best effort: never fail a reconcile for one
            log.warning("event %s on %s failed: %s", reason, owner.key, exc)
