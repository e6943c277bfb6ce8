"""What a real vLLM or SGLang pod needs beyond its command line (docs/configure.md, "Running on a real cluster").

`dress` adds to an engine pod template: a /dev/shm sized from the pool's GPUs, the Hugging Face
token from its Secret, the model cache volume with HF_HOME, the network profile's device
resources, annotations, environment and capabilities, the multi-node NVLink environment on a
ComputeDomain channel, the wide expert-parallel environment, arm64 on GB200, a startup probe
sized from the weights, the memory of a kvOffload CPU tier, and the user's own service account and
scheduling rules. What the user wrote wins over a generated default of the same name.
"""

from __future__ import annotations

from typing import Any, Final

from xpyd_api import fabrics
from xpyd_api import labels as L
from xpyd_api.fabrics import FabricParts
from xpyd_api.models import HF_TOKEN, DisaggregatedDeploymentSpec, PoolSpec
from xpyd_api.quantity import bytes_quantity, quantity_bytes
from xpyd_operator import engine, engines, podsecurity, sizing
from xpyd_operator.build_context import PoolBuild

SHM_VOLUME: Final = "dshm"  # the name pools.py gives the memory-backed /dev/shm
CACHE_VOLUME: Final = "model-cache"
ARM64_TOLERATION: Final = {"key": L.ARCH, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}
# A replica whose ranks span pods bootstraps NCCL, Gloo and NVSHMEM over the pod's own interface
# (llm-d wide-ep-lws, SGLang's LWS example, Dynamo's GB200 recipe).
MULTI_NODE_ENV: Final = (
    ("NCCL_SOCKET_IFNAME", "eth0"),
    ("GLOO_SOCKET_IFNAME", "eth0"),
    ("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "eth0"),
)
# Wide expert parallelism across nodes without multi-node NVLink: DeepEP's all-to-all goes over the
# RDMA NICs by GPU-initiated transfers (InfiniBand GPUDirect Async).
IBGDA_ENV: Final = (("NVSHMEM_REMOTE_TRANSPORT", "ibgda"), ("NVSHMEM_IB_ENABLE_IBGDA", "1"))


def fabric(spec: DisaggregatedDeploymentSpec, pool: PoolSpec) -> FabricParts:
    """The network profile's parts for one pod of `pool`, with spec.network's own additions on top."""
    network = spec.network
    if network is None:
        return FabricParts()
    gpus = pool.layout(spec.topology.hardware).gpus_per_pod
    base = fabrics.PROFILES[network.profile].parts(gpus, network.devices_per_gpu)
    caps = tuple(sorted({*base.capabilities, *network.capabilities}))
    return FabricParts(
        {**base.resources, **network.resources},
        {**base.annotations, **network.annotations},
        {**base.env, **network.env},
        caps,
        base.nixl_backends,
    )


def _cache(spec: DisaggregatedDeploymentSpec) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """(volume, mount, mount path) of the model cache; engines that download get an emptyDir by default."""
    cache = spec.model.cache
    if cache is None:
        if podsecurity.own_image_engine(spec):
            return None  # the emulator downloads nothing
        size = sizing.cache_size(spec)
        source: dict[str, Any] = {"emptyDir": {"sizeLimit": size} if size else {}}
        path = "/model-cache"
    else:
        path = cache.mount_path
        if cache.persistent_volume_claim is not None:
            claim = cache.persistent_volume_claim
            source = {"persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": claim.read_only}}
        elif cache.host_path is not None:
            source = {"hostPath": {"path": cache.host_path.path, "type": cache.host_path.type}}
        else:
            limit = cache.empty_dir.size_limit if cache.empty_dir else None
            source = {"emptyDir": {"sizeLimit": limit} if limit else {}}
    mount: dict[str, Any] = {"name": CACHE_VOLUME, "mountPath": path}
    if cache is not None and cache.read_only:
        mount["readOnly"] = True
    return {"name": CACHE_VOLUME, **source}, mount, path


def env_pairs(
    spec: DisaggregatedDeploymentSpec, pool: PoolSpec, parts: FabricParts, mnnvl: bool, role: str = ""
) -> list[dict[str, Any]]:
    """The generated environment, in the order it is added."""
    out: list[dict[str, Any]] = []
    if spec.model.token_secret is not None:
        out.append(spec.model.token_secret.env(HF_TOKEN))
    cache = _cache(spec)
    if cache is not None:
        out.append({"name": "HF_HOME", "value": cache[2]})
        if spec.model.cache is not None and spec.model.cache.read_only:
            out.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    pairs = list(parts.env.items())
    topology = spec.topology.hardware
    if mnnvl and topology is not None:
        pairs += list(topology.mnnvl_env)
    pairs += engines.renderer(spec.engine.kind).env(spec, role, pool, engines.profile_of(spec))
    if pool.layout(topology).multi_node:
        pairs += list(MULTI_NODE_ENV)
        if pool.expert_parallel and not mnnvl:
            pairs += list(IBGDA_ENV)
    seen = {e["name"] for e in out}
    for k, v in pairs:  # the first wins: a network profile's value over the multi-node default of the same name
        if k not in seen:
            seen.add(k)
            out.append({"name": k, "value": v})
    return out


def _add_env(container: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    have = {e["name"] for e in container.get("env") or []}
    container["env"] = [*(container.get("env") or []), *(e for e in extra if e["name"] not in have)]


def _add_resources(container: dict[str, Any], resources: dict[str, str]) -> None:
    res = container.setdefault("resources", {})
    for name, quantity in resources.items():
        if name in res.get("requests", {}):
            continue  # spec.engine.resources names it: the user's count wins
        res.setdefault("requests", {})[name] = quantity
        if engine.needs_limit(name):
            res.setdefault("limits", {})[name] = quantity


def _add_tier_memory(container: dict[str, Any], tier: int) -> None:
    """The pool's CPU KV tier on top of the engine's memory: the request grows by it, and a limit too."""
    if tier <= 0:
        return
    res = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        have = res.get(kind, {}).get("memory")
        if have is None and kind == "limits":
            continue  # no limit to raise: the request reserves the tier
        base = quantity_bytes(str(have)) if have is not None else 0
        res.setdefault(kind, {})["memory"] = bytes_quantity((base or 0) + tier)


def _add_capabilities(container: dict[str, Any], extra: tuple[str, ...]) -> None:
    requests = container.get("resources", {}).get("requests", {})
    caps = container.setdefault("securityContext", {}).setdefault("capabilities", {"drop": ["ALL"]})
    wanted = {*caps.get("add", []), *extra, *podsecurity.fabric_capabilities(requests)}
    if wanted:
        caps["add"] = sorted(wanted)


def _affinity(generated: dict[str, Any] | None, user: dict[str, Any] | None) -> dict[str, Any] | None:
    """The user's affinity with the operator's required node terms (the clique pin) ANDed into each term."""
    if not user:
        return generated
    out = dict(user)
    ours = ((generated or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if ours is None:
        return out
    pin = [e for term in ours["nodeSelectorTerms"] for e in term.get("matchExpressions", [])]
    node = dict(out.get("nodeAffinity") or {})
    theirs = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}]
    terms = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), *pin]} for t in theirs]
    node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    out["nodeAffinity"] = node
    return out


def _schedule(pod: dict[str, Any], spec: DisaggregatedDeploymentSpec) -> None:
    rules = spec.scheduling
    topology = spec.topology.hardware
    if rules.node_selector:
        pod["nodeSelector"] = {**rules.node_selector, **(pod.get("nodeSelector") or {})}
    tolerations = list(pod.get("tolerations") or [])
    if topology is not None and topology.arch == "arm64":
        tolerations.append(dict(ARM64_TOLERATION))  # GB200 trays are Grace (arm64); some clouds taint them
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in rules.tolerations]
    if tolerations:
        pod["tolerations"] = tolerations
    if (affinity := _affinity(pod.get("affinity"), rules.affinity)) is not None:
        pod["affinity"] = affinity
    if rules.priority_class_name:
        pod["priorityClassName"] = rules.priority_class_name
    if spec.engine.service_account_name:
        pod["serviceAccountName"] = spec.engine.service_account_name


def dress(template: dict[str, Any], b: PoolBuild) -> dict[str, Any]:
    """The engine pod template with everything a real engine needs added (see the module docstring)."""
    spec, pool = b.spec, b.pool
    pod = template["spec"]
    main = pod["containers"][0]
    parts = fabric(spec, pool)
    for volume in pod.get("volumes") or []:
        if volume["name"] == SHM_VOLUME:
            volume["emptyDir"] = {"medium": "Memory", "sizeLimit": sizing.shm_size(spec, pool)}
    if (cache := _cache(spec)) is not None:
        pod["volumes"] = [*(pod.get("volumes") or []), cache[0]]
        main["volumeMounts"] = [*(main.get("volumeMounts") or []), cache[1]]
    role = b.role
    _add_env(main, env_pairs(spec, pool, parts, b.imex and "resourceClaims" in pod, role))
    _add_resources(main, parts.resources)
    _add_tier_memory(main, engines.kv_offload_bytes(spec, role, pool))
    _add_capabilities(main, parts.capabilities)
    if parts.annotations:
        template["metadata"]["annotations"] = {**parts.annotations, **template["metadata"].get("annotations", {})}
    probe = main.get("startupProbe")
    if probe is not None:
        probe["periodSeconds"] = sizing.STARTUP_PERIOD_S
        probe["failureThreshold"] = sizing.startup_failure_threshold(spec, pool)
    _schedule(pod, spec)
    return template
