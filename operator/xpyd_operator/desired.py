"""The desired state of one DisaggregatedDeployment: a pure function of its spec and what was observed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xpyd_api import handoff, podpatch
from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_api.podmodels import NetworkSpec
from xpyd_operator import engines, groups, lockstep, netpolicy, podsecurity, pools, rollout, routerkit, sizing
from xpyd_operator.autoscaling.spec import managed_pools
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.meta import Owner, child_name, stamp
from xpyd_operator.placement import Demand, NodeInfo, Placement, PodInfo, Reservation, free_by_clique, place
from xpyd_operator.placement import unschedulable_reason as _unschedulable

WORKLOADS = frozenset({"StatefulSet", groups.KIND, "Deployment"})  # applied after the objects they use
STEPPED = frozenset({"StatefulSet", groups.KIND})  # the pools' workloads, which an engine change steps in lockstep


@dataclass
class Observed:
    """What the reconciler read from the cluster for one deployment."""

    nodes: list[NodeInfo] = field(default_factory=list)
    pods: list[PodInfo] = field(default_factory=list)  # GPU pods cluster-wide (NVL72 only)
    reservations: list[Reservation] = field(default_factory=list)
    children: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) -> object
    own_pods: list[dict[str, Any]] = field(default_factory=list)
    compute_domain_crd: bool = False
    lws_crd: bool = False  # leaderworkersets.leaderworkerset.x-k8s.io is installed
    pod_monitor_crd: bool = False  # podmonitors.monitoring.coreos.com is installed (the Prometheus Operator)


@dataclass
class Desired:
    placement: Placement | None
    children: list[dict[str, Any]]
    error: tuple[str, str] | None = None  # (reason, message) that keeps children untouched
    rollout: lockstep.Plan | None = None  # an engine change's lockstep (StatefulSet or LeaderWorkerSet pools), or None


class InputError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def observed_replicas(observed: Observed, owner: Owner, role: str) -> int | None:
    workload = groups.find(observed.children, owner, role)
    value = (workload or {}).get("spec", {}).get("replicas")
    return int(value) if value is not None else None


def demands(spec: DisaggregatedDeploymentSpec, observed: Observed, owner: Owner) -> list[Demand]:
    out = []
    for role, pool in spec.pools().items():
        replicas = pool.replicas
        if replicas is None:
            replicas = observed_replicas(observed, owner, role)
        if replicas is None:
            replicas = pool.autoscaling.min_replicas if pool.autoscaling else 1
        layout = pool.layout(spec.topology.hardware)
        out.append(Demand(role, replicas, pool.gpus_per_replica, pool.tp, layout.pods))
    return out


def current_pins(observed: Observed, owner: Owner, roles: list[str]) -> dict[str, str | None]:
    pins: dict[str, str | None] = {}
    for role in roles:
        workload = groups.find(observed.children, owner, role) or {}
        template_labels = groups.api_template(workload).get("metadata", {}).get("labels", {})
        pins[role] = template_labels.get(L.NVLINK_DOMAIN_LABEL)
    return pins


MODEL_CONFIG_HINT = (
    "to serve a model outside the catalog give its Hugging Face config.json: "
    "kubectl -n <namespace> create configmap <name> --from-file=config.json and spec.model.configMap.name: <name> "
    "(or the keys inline in spec.model.config), or set spec.model.kvBytesPerToken, "
    "or let the operator fetch it from the Hugging Face Hub (xpyd operator --model-hub; "
    "helm value operator.modelHub.enabled=true)"
)


def check_model(spec: DisaggregatedDeploymentSpec) -> None:
    """The model's shape is known: from its config.json (readable), from the catalog, or kvBytesPerToken."""
    from xpyd_perf import ModelConfigError, UnknownModelError, resolve_model

    if spec.model.config_map is not None and spec.model.config is None:  # the reconciler reads it in first
        raise InputError("ModelConfigInvalid", f"{sizing.config_source(spec)} was not read")
    try:
        known = sizing.declared_model(spec)
    except ModelConfigError as exc:
        raise InputError("ModelConfigInvalid", f"{sizing.config_source(spec)}: {exc}") from None
    if known is not None or spec.model.kv_bytes_per_token is not None:
        return
    try:
        resolve_model(spec.model.name)
    except UnknownModelError as exc:
        raise InputError("UnknownModel", f"{exc}; {MODEL_CONFIG_HINT}") from None


def check_groups(spec: DisaggregatedDeploymentSpec, observed: Observed) -> None:
    """A pool whose replica spans nodes needs the LeaderWorkerSet API, and tensor parallel across nodes an
    engine release that has it without Ray (the profile's multi_node_tp: vLLM v0.11.1+)."""
    layouts = spec.layouts()
    wide = [f"{role} ({layout.describe()})" for role, layout in layouts.items() if layout.multi_node]
    if wide and not observed.lws_crd:
        raise InputError(
            "LeaderWorkerSetMissing",
            f"{', '.join(wide)} spans nodes and runs as a LeaderWorkerSet, whose API "
            f"({groups.CRD}) is not installed; {groups.INSTALL_HINT}",
        )
    profile = engines.profile_of(spec)
    if not profile.multi_node_tp:
        for role, layout in layouts.items():
            if layout.multi_node and layout.dp == 1:
                raise InputError(
                    "EngineTooOld",
                    f"{role} ({layout.describe()}): {profile.kind} {profile.version_text} runs tensor/pipeline "
                    "parallel across nodes only with Ray; set spec.engine.image to "
                    f"{engines.default_image(profile.kind)} (or spec.engine.version), or use data parallel "
                    "(dataParallelSize) across the nodes",
                )


def check_engine(spec: DisaggregatedDeploymentSpec) -> None:
    """Refuse an engine kind or release the seam has no profile for (never a silent fallback to another)."""
    try:
        engines.profile_of(spec)
    except engines.EngineUnsupported as exc:
        raise InputError("EngineUnsupported", str(exc)) from None


def check_handoff(spec: DisaggregatedDeploymentSpec) -> None:
    """Refuse prefill and decode pools that cannot hand KV over (xpyd_api.handoff): they would never be paired."""
    if (problem := handoff.check(spec)) is not None:
        raise InputError(handoff.REASON, problem)


def check_fit(spec: DisaggregatedDeploymentSpec) -> None:
    """Refuse a replica whose GPUs cannot hold the weights and one longest sequence (xpyd_perf.fits)."""
    for role, pool in spec.pools().items():
        fit = sizing.replica_fit_of(spec, pool)
        if fit is not None and not fit.fits:
            raise InputError("ReplicaDoesNotFit", f"{role}: {fit.summary()}")


def with_defaults(spec: DisaggregatedDeploymentSpec, network: NetworkSpec | None) -> DisaggregatedDeploymentSpec:
    """The spec with the operator's defaults for what it leaves out (the chart's network profile)."""
    if spec.network is not None or network is None:
        return spec
    return spec.model_copy(update={"network": network})


def with_model_config(spec: DisaggregatedDeploymentSpec, config: dict[str, Any]) -> DisaggregatedDeploymentSpec:
    """The spec with the model's config.json read in (what spec.model.configMap holds) as spec.model.config;
    spec.model.configMap stays, so messages name the ConfigMap."""
    return spec.model_copy(update={"model": spec.model.model_copy(update={"config": config})})


def patched(workload: dict[str, Any], spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> dict[str, Any]:
    """A pool's workload with spec.podTemplatePatch, then the pool's own, applied to each pod template."""
    for template in groups.templates(workload):
        merged = template
        for patch in (spec.pod_template_patch, pool.pod_template_patch):
            if patch:
                merged = podpatch.merge(merged, patch)
        engine = next(c for c in merged["spec"]["containers"] if c["name"] == podpatch.ENGINE_CONTAINER)
        merged["metadata"]["labels"][L.ENGINE_REV] = rollout.engine_rev(
            engine.get("image", ""), spec.engine.kv_connector, handoff.pool_facts(spec, pool)
        )
        template.clear()
        template.update(merged)
    return workload


def placement_for(spec: DisaggregatedDeploymentSpec, observed: Observed, owner: Owner) -> Placement:
    wanted = demands(spec, observed, owner)
    topology = spec.topology.hardware
    reason = _unschedulable(observed.nodes, topology, wanted)
    if reason is not None:
        raise InputError("Unschedulable", reason)
    free = None
    if topology is not None and topology.nvlink_domain == "clique":
        free = free_by_clique(observed.nodes, observed.pods, observed.reservations, owner.key)
    return place(topology, wanted, free, current_pins(observed, owner, [d.role for d in wanted]))


def autoscaled(spec: DisaggregatedDeploymentSpec, autoscaler: Mapping[str, Any] | None) -> DisaggregatedDeploymentSpec:
    """The spec with each autoscaled pool sized as the autoscaler last decided (status.autoscaler.<pool>.desired).

    The reconciler is the one writer of StatefulSet replicas: the autoscaler records its decision in
    status (and asks for a reconcile), and this is where it is applied, clamped into the spec's bounds.
    """
    if not autoscaler:
        return spec
    pools = spec.pools()
    update: dict[str, PoolSpec] = {}
    for role, bounds in managed_pools(spec).items():
        decided = (autoscaler.get(role) or {}).get("desired") if isinstance(autoscaler.get(role), dict) else None
        if isinstance(decided, int):
            update[role] = pools[role].model_copy(update={"replicas": bounds.clamp(decided)})
    return spec.model_copy(update=update) if update else spec


def build_children(
    owner: Owner,
    spec: DisaggregatedDeploymentSpec,
    placement: Placement,
    compute_domain_crd: bool,
    own_image: str,
    router_image: str,
    pull_secrets: Sequence[str] = (),
    monitor: routerkit.MonitorSettings | None = None,
) -> list[dict[str, Any]]:
    """Every child manifest, stamped with its applied-hash, in the order they are applied.

    Every pod template gets the operator's pull secrets (pull_secrets) and the deployment's own. `monitor`:
    a PodMonitor for routers that serve TLS (None: the cluster has no PodMonitor API, or it is off).
    """
    pool_specs: dict[str, PoolSpec] = spec.pools()
    pinned = {c for c in placement.pins.values() if c is not None}
    topology = spec.topology.hardware
    wants_cd = topology is not None and topology.compute_domain
    use_cd = compute_domain_crd and wants_cd and len(pinned) == 1 and placement.satisfied
    out: list[dict[str, Any]] = [
        routerkit.service_account(owner),
        routerkit.role(owner),
        routerkit.role_binding(owner),
    ]
    for role in pool_specs:
        out += [pools.headless_service(owner, role), pools.disruption_budget(owner, role)]
    if use_cd:
        layouts = spec.layouts()
        nodes = sum((p.replicas or 1) * layouts[role].pods for role, p in pool_specs.items())
        out.append(pools.compute_domain(owner, nodes))
    for role in pool_specs:
        out.append(pools.workload(PoolBuild.placed(owner, spec, role, placement, use_cd, own_image)))
    if (router_budget := routerkit.disruption_budget(owner, spec)) is not None:
        out.append(router_budget)
    out += [routerkit.deployment(owner, spec, router_image), routerkit.service(owner, spec)]
    if monitor is not None and (router_monitor := routerkit.pod_monitor(owner, spec, monitor)) is not None:
        out.append(router_monitor)
    secrets = podsecurity.pull_secret_names(pull_secrets, spec)
    out = [podsecurity.with_pull_secrets(m, secrets) for m in out]
    out += netpolicy.policies(owner, spec)  # none unless spec.networkPolicy.enabled
    # Pod template patches come last, after every generated field (pull secrets included).
    engines = {(m["kind"], m["metadata"]["name"]): m for m in out}
    for role, pool in pool_specs.items():
        if spec.pod_template_patch or pool.pod_template_patch:
            patched(groups.find(engines, owner, role) or {}, spec, pool)
    return [stamp(m) for m in out]


def desire(
    owner: Owner,
    spec: DisaggregatedDeploymentSpec,
    observed: Observed,
    own_image: str,
    router_image: str,
    pull_secrets: Sequence[str] = (),
    monitor: routerkit.MonitorSettings | None = None,
) -> Desired:
    """Placement and children, or the input error that leaves the running children untouched."""
    try:
        check_engine(spec)
        check_model(spec)
        check_fit(spec)
        check_groups(spec, observed)
        placement = placement_for(spec, observed, owner)
        check_handoff(spec)
    except InputError as exc:
        return Desired(None, [], (exc.reason, exc.message))
    cd_crd = observed.compute_domain_crd
    monitor = monitor if observed.pod_monitor_crd else None
    children = build_children(owner, spec, placement, cd_crd, own_image, router_image, pull_secrets, monitor)
    children, roll = in_step(owner, spec, children, observed)
    return Desired(placement, children, rollout=roll)


def in_step(
    owner: Owner, spec: DisaggregatedDeploymentSpec, children: list[dict[str, Any]], observed: Observed
) -> tuple[list[dict[str, Any]], lockstep.Plan | None]:
    """The children with an engine change's next lockstep applied to the pools' workloads (xpyd_operator.lockstep).

    Each pool is a StatefulSet or a LeaderWorkerSet (one of each works too): both step through the change
    together, by their partitions. A pool whose workload changes kind has no observed one of its new kind:
    it starts afresh (the old one is pruned), with nothing to step with.
    """
    roles = [r for r in spec.pools() if r in ("prefill", "decode")]
    names = {child_name(owner, r): r for r in roles}
    wanted = {m["metadata"]["name"]: m for m in children if m["kind"] in STEPPED and m["metadata"]["name"] in names}
    if len(roles) < 2 or len(wanted) < len(roles):
        return children, None
    views = []
    for name, role in names.items():
        pods = [p for p in observed.own_pods if ((p.get("metadata") or {}).get("labels") or {}).get(L.ROLE) == role]
        have = observed.children.get((wanted[name]["kind"], name))
        views.append(lockstep.pool_view(role, wanted[name], have, pods))
    owns = all(m["spec"].get("replicas") is not None for m in wanted.values())
    roll = lockstep.plan(views, spec.rollout.max_surge, spec.rollout.rollback, owns)
    if not roll.steps:
        return children, roll
    out = []
    for m in children:
        role = names.get(m["metadata"]["name"], "") if m["kind"] in STEPPED else ""
        out.append(stamp(lockstep.apply(m, roll.steps[role], owns)) if role in roll.steps else m)
    return out, roll


def needs_apply(want: dict[str, Any], have: dict[str, Any] | None) -> bool:
    """Level check: missing, applied from another manifest, or replicas drifted from a set value."""
    if have is None:
        return True
    annotations = have.get("metadata", {}).get("annotations") or {}
    if annotations.get(L.APPLIED_HASH) != want["metadata"]["annotations"][L.APPLIED_HASH]:
        return True
    if want["kind"] not in WORKLOADS:
        return False
    wanted = want["spec"].get("replicas")
    if wanted is not None and have.get("spec", {}).get("replicas") != wanted:
        return True
    return _containers(want) != _containers(have)


def _containers(obj: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(image, command) of every container of every pod template (StatefulSet, Deployment, LeaderWorkerSet)."""
    containers = [c for t in groups.templates(obj) for c in t.get("spec", {}).get("containers") or []]
    return [(c.get("image"), c.get("command")) for c in containers]


def obsolete(desired: list[dict[str, Any]], observed: Observed) -> list[tuple[str, str]]:
    """Children this deployment made earlier that the current spec no longer wants."""
    keep = {(m["kind"], m["metadata"]["name"]) for m in desired}
    return sorted(k for k in observed.children if k not in keep)
