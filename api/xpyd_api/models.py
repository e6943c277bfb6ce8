"""The DisaggregatedDeployment API (xpyd.io/v1alpha1): the one source of truth for CRD and operator."""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from xpyd_api import engines as engine_profiles
from xpyd_api.apibase import FREE_FORM, QUANTITY, ApiModel, cel
from xpyd_api.engines import Kind
from xpyd_api.layout import ReplicaLayout, replica_layout
from xpyd_api.netmodels import NetworkPolicySpec
from xpyd_api.podmodels import (
    ModelCache,
    NetworkSpec,
    SchedulingSpec,
    SecretKeySelector,
    checked_patch,
    template_patch_field,
)
from xpyd_api.podpatch import ENGINE_CONTAINER
from xpyd_api.quantity import bytes_quantity, quantity_bytes
from xpyd_api.rules import (
    MAX_REPLICA_GPUS,
    POOL_RULES,
    ROOT_RULES,
    SPEC_RULES,
    TOPOLOGY_KINDS,
    SpecError,
    check_engine,
    check_pool,
    check_spec,
    check_world,
)
from xpyd_perf.topology import TOPOLOGIES, Topology

EngineKind = Kind  # the kinds the engine profiles know (xpyd_api.engines)
HF_TOKEN: Final = "HF_TOKEN"  # what model.tokenSecret sets: vLLM, SGLang and huggingface_hub read it
MODEL_CONFIG_KEY: Final = "config.json"  # the key `kubectl create configmap NAME --from-file=config.json` writes
MODEL_CONFIG_ONE_SOURCE: Final = "model takes config or configMap, not both"
ANY_TOPOLOGY: Final = "Any"  # pins nothing: no hardware to model or to select nodes by
Mode = Literal["Disaggregated", "Colocated"]
RouterPolicy = Literal["kv-aware", "least-loaded", "round-robin"]
DataParallelRouting = Literal["auto", "ranks", "engine"]
RouterLogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
RouterServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]
AUTO_TOKENIZER: Final = "auto"
# auto | none | hf:owner/name[@revision] (the router's grammar for a Hub repository) | an absolute path
TOKENIZER_PATTERN: Final = (
    r"^(auto|none|hf:[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?(@[A-Za-z0-9._/-]{1,255})?"
    r"|/[^\s]*)$"
)


def usable_tokenizer(value: str) -> bool:
    """Whether the router accepts this --tokenizer (the CRD's pattern and its rule against '..')."""
    return re.fullmatch(TOKENIZER_PATTERN, value) is not None and ".." not in value


ConditionStatus = Literal["True", "False", "Unknown"]
KvPath = Literal["NVLink", "RDMA", "Local", "Unknown"]


def _not_stored(schema: dict[str, Any]) -> None:
    """Keeps a default out of the CRD: the operator applies it when reading; the API server stores none."""
    schema.pop("default", None)


_Model = ApiModel  # camelCase aliases, unknown fields refused (xpyd_api.apibase)


class ConfigMapKeySelector(_Model):
    """A key of a ConfigMap in the deployment's namespace."""

    name: str = Field(min_length=1, max_length=253, description="A ConfigMap in the deployment's namespace.")
    key: str = Field(default=MODEL_CONFIG_KEY, min_length=1, description="The key of its data holding config.json.")


class ModelSpec(_Model):
    """The served model."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [{"rule": "!(has(self.config) && has(self.configMap))", "message": MODEL_CONFIG_ONE_SOURCE}]
        )
    )

    name: str = Field(min_length=1, description="Model to serve, e.g. meta-llama/Llama-3.1-70B-Instruct.")
    kv_bytes_per_token: int | None = Field(
        default=None,
        ge=1,
        description="KV-cache bytes per token; overrides what config/configMap or the catalog says.",
    )
    config_map: ConfigMapKeySelector | None = Field(
        default=None,
        description="A ConfigMap holding the model's Hugging Face config.json (kubectl create configmap NAME "
        "--from-file=config.json): the operator reads the KV-cache size, the weights and the fits-check from it, "
        "for any model; a catalog model needs none.",
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description="The model's config.json inline (its keys as in the file), instead of configMap.",
        json_schema_extra=FREE_FORM,
    )
    token_secret: SecretKeySelector | None = Field(
        default=None, description="The Hugging Face token (HF_TOKEN) from a Secret key, for gated models."
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Volume for downloaded weights (HF_HOME); default: an emptyDir sized from the model's weights.",
    )

    @model_validator(mode="after")
    def _one_config(self) -> ModelSpec:
        if self.config is not None and self.config_map is not None:
            raise ValueError(MODEL_CONFIG_ONE_SOURCE)
        return self


class EnvVarSource(_Model):
    secret_key_ref: SecretKeySelector = Field(description="Read the value from a Secret, e.g. HF_TOKEN.")


class EnvVar(_Model):
    name: str = Field(min_length=1)
    value: str = ""
    value_from: EnvVarSource | None = Field(default=None, description="Instead of value: from a Secret's key.")

    def manifest(self) -> dict[str, Any]:
        """The container env entry."""
        if self.value_from is None:
            return {"name": self.name, "value": self.value}
        return self.value_from.secret_key_ref.env(self.name)


class LocalObjectReference(_Model):
    """A Secret in the deployment's own namespace, named as a pod's imagePullSecrets entry names it."""

    name: str = Field(min_length=1, max_length=253)


class EngineSpec(_Model):
    """The inference engine every worker pod runs."""

    model_config = ConfigDict(json_schema_extra=cel(POOL_RULES["engine"]))

    kind: EngineKind = Field(
        default="vllm", description="vllm | sglang | emulator (xpyd's vLLM emulator, for GPU-less clusters)."
    )
    image: str | None = Field(
        default=None, description="Container image; the newest release xpyd checked, per kind, when omitted."
    )
    version: str | None = Field(
        default=None,
        pattern=r"^v?[0-9]+\.[0-9]+\.[0-9]+$",
        description="The engine release the image holds (e.g. 0.34.0) when its tag names none (a digest or a "
        "custom tag); it picks the flags xpyd renders. Default: the image tag's version.",
    )
    kv_connector: str = Field(default="NixlConnector", description="vLLM KV connector for the handoff.")
    kv_transfer_config: dict[str, str] = Field(
        default_factory=dict,
        description="vLLM only: extra keys of --kv-transfer-config (e.g. kv_buffer_device: cpu on CPU engines); "
        "kv_connector and kv_role are the operator's.",
    )
    args: list[str] = Field(default_factory=list, description="Extra engine arguments, appended.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for engine containers.")
    resources: dict[str, str] = Field(
        default_factory=dict, description="Extra resource requests, e.g. {cpu: '16', memory: 200Gi}."
    )
    drain_seconds: int = Field(
        default=120, ge=0, le=3600, description="Grace period for in-flight requests on pod termination."
    )
    service_account_name: str | None = Field(
        default=None, min_length=1, description="ServiceAccount of engine pods (e.g. workload identity for a bucket)."
    )
    shared_memory_size: str | None = Field(
        default=None, pattern=QUANTITY, description="Size of /dev/shm; default 2Gi per GPU, at least 8Gi."
    )

    @model_validator(mode="after")
    def _check(self) -> EngineSpec:
        check_engine(self.kind, self.kv_transfer_config)
        return self


class PoolAutoscaling(_Model):
    model_config = ConfigDict(json_schema_extra=cel(POOL_RULES["autoscaling"]))

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)


KvOffloadBackend = Literal["native", "lmcache"]
KV_OFFLOAD_BACKENDS: Final[tuple[KvOffloadBackend, ...]] = ("native", "lmcache")


class KvOffloadSpec(_Model):
    """A host-memory tier under the GPU KV cache: blocks evicted from the GPU are kept in CPU memory and loaded back."""

    cpu_memory: str = Field(
        pattern=QUANTITY,
        description="Host memory of one replica's CPU tier, all its ranks together, e.g. 64Gi; the pod's memory"
        " request grows by its share.",
    )
    backend: KvOffloadBackend = Field(
        default="native",
        description="vLLM's offloading backend: native (its OffloadingConnector) or lmcache. SGLang uses HiCache.",
        json_schema_extra={"enum": list(KV_OFFLOAD_BACKENDS)},
    )
    disk: str | None = Field(
        default=None,
        pattern=QUANTITY,
        description="A local-disk tier below the CPU tier; no engine release xpyd serves takes its size yet.",
    )

    @field_validator("cpu_memory", "disk")
    @classmethod
    def _size(cls, v: str | None, info: Any) -> str | None:
        if v is None:
            return v
        name = "cpuMemory" if info.field_name == "cpu_memory" else "disk"
        n = quantity_bytes(v)
        if n is None or n <= 0:
            raise ValueError(f"kvOffload.{name} must be a positive memory quantity such as 64Gi, got {v!r}")
        return v

    @property
    def cpu_bytes(self) -> int:
        return quantity_bytes(self.cpu_memory) or 0


class PoolSpec(_Model):
    """One pool of identical engine replicas: a StatefulSet, or a LeaderWorkerSet when a replica spans nodes."""

    model_config = ConfigDict(json_schema_extra=cel(POOL_RULES["pool"]))

    replicas: int | None = Field(
        default=None, ge=0, description="Omit to leave replicas to an external scaler (HPA, KEDA, xpyd)."
    )
    gpus_per_replica: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICA_GPUS,
        description="GPUs of one replica (one engine). Larger than a node: whole nodes, one pod each, as a"
        " LeaderWorkerSet group (8 GPUs per HGX node, 4 per GB200 tray).",
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        description="Tensor-parallel size; defaults to gpusPerReplica / (dataParallelSize x pipelineParallelSize).",
    )
    pipeline_parallel_size: int = Field(
        default=1, ge=1, le=MAX_REPLICA_GPUS, description="Pipeline-parallel stages of one replica (vLLM, SGLang)."
    )
    data_parallel_size: int = Field(
        default=1, ge=1, le=MAX_REPLICA_GPUS, description="Data-parallel ranks in one replica (wide expert parallel)."
    )
    expert_parallel: bool = Field(
        default=False, description="Spread the MoE experts over the replica's ranks (vLLM --enable-expert-parallel)."
    )
    args: list[str] = Field(default_factory=list, description="Extra engine arguments for this pool only.")
    autoscaling: PoolAutoscaling | None = None
    kv_offload: KvOffloadSpec | None = Field(
        default=None,
        description="Offload KV cache to host memory (a CPU tier under the GPU's): worth it when the working set"
        " outgrows GPU KV (long shared prefixes, multi-turn chat); costs host memory and PCIe bandwidth.",
    )
    pod_template_patch: dict[str, Any] | None = template_patch_field("this pool's")

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        scaling = self.autoscaling
        check_pool(self.replicas, (scaling.min_replicas, scaling.max_replicas) if scaling else None)
        check_world(
            self.gpus_per_replica, self.tensor_parallel_size, self.data_parallel_size, self.pipeline_parallel_size
        )
        checked_patch(self.pod_template_patch, "podTemplatePatch")
        return self

    @property
    def tp(self) -> int:
        parts = self.data_parallel_size * self.pipeline_parallel_size
        return self.tensor_parallel_size or max(1, self.gpus_per_replica // parts)

    @property
    def world_size(self) -> int:
        """Engine ranks of one replica: tensor x pipeline x data parallel (its GPUs, one rank each)."""
        return self.tp * self.pipeline_parallel_size * self.data_parallel_size

    def layout(self, topology: Topology | None) -> ReplicaLayout:
        """Pods and parallelism of one replica on `topology` (one pod when the node size is unknown)."""
        return replica_layout(
            self.gpus_per_replica,
            self.tp,
            self.pipeline_parallel_size,
            self.data_parallel_size,
            self.expert_parallel,
            topology.gpus_per_node if topology is not None else None,
        )


class TopologySpec(_Model):
    kind: str = Field(
        default=ANY_TOPOLOGY,
        description=f"{' | '.join(TOPOLOGY_KINDS)} (pins nothing).",
        json_schema_extra={"enum": list(TOPOLOGY_KINDS)},
    )

    @field_validator("kind")
    @classmethod
    def _known(cls, kind: str) -> str:
        if kind not in TOPOLOGY_KINDS:
            raise ValueError(f"topology.kind must be one of {', '.join(TOPOLOGY_KINDS)}, got {kind!r}")
        return kind

    @property
    def hardware(self) -> Topology | None:
        """The topology table's entry for this kind; None for Any."""
        return None if self.kind == ANY_TOPOLOGY else TOPOLOGIES[self.kind]


class RouterServiceSpec(_Model):
    """The router's Service: how clients outside the cluster (or a gateway inside) reach port 8000."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [
                {
                    "rule": "!has(self.loadBalancerClass) || self.type == 'LoadBalancer'",
                    "message": "router.service.loadBalancerClass needs type LoadBalancer",
                },
                {
                    "rule": "!has(self.externalTrafficPolicy) || self.type != 'ClusterIP'",
                    "message": "router.service.externalTrafficPolicy needs type NodePort or LoadBalancer",
                },
            ]
        )
    )

    type: RouterServiceType = Field(
        default="ClusterIP",
        description="ClusterIP (in-cluster only: a Gateway, an Ingress or port-forward in front), NodePort, or "
        "LoadBalancer (the cloud's load balancer; the cluster allocates the node port and address).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations on the Service, e.g. a cloud load balancer's "
        "(service.beta.kubernetes.io/aws-load-balancer-scheme: internal).",
    )
    load_balancer_class: str | None = Field(
        default=None, min_length=1, max_length=316, description="type LoadBalancer: the load balancer implementation."
    )
    external_traffic_policy: Literal["Cluster", "Local"] | None = Field(
        default=None,
        description="NodePort or LoadBalancer: 'Local' keeps the client's address (only nodes running a router "
        "answer); default the cluster's ('Cluster').",
    )

    @model_validator(mode="after")
    def _check(self) -> RouterServiceSpec:
        if self.load_balancer_class is not None and self.type != "LoadBalancer":
            raise ValueError("router.service.loadBalancerClass needs type LoadBalancer")
        if self.external_traffic_policy is not None and self.type == "ClusterIP":
            raise ValueError("router.service.externalTrafficPolicy needs type NodePort or LoadBalancer")
        return self


class RouterTls(_Model):
    secret_name: str = Field(
        min_length=1,
        max_length=253,
        description="A kubernetes.io/tls Secret in the deployment's namespace (tls.crt, tls.key, optional "
        "ca.crt; e.g. cert-manager's): the router serves HTTPS with it and reloads it when it is renewed.",
    )


class RouterSpec(_Model):
    replicas: int = Field(default=1, ge=0)
    policy: RouterPolicy = "kv-aware"
    image: str | None = Field(default=None, description="Router image; the operator's default when omitted.")
    api_key_secret: SecretKeySelector | None = Field(
        default=None,
        description="Clients must send `Authorization: Bearer <key>` with a key in this Secret key's value (one "
        "key a line, so a rotation can overlap); mounted as a file, re-read within seconds of a change; open "
        "when omitted.",
    )
    tokenizer: str = Field(
        default=AUTO_TOKENIZER,
        max_length=300,
        pattern=TOKENIZER_PATTERN,
        json_schema_extra=cel([{"rule": "!self.contains('..')", "message": "router.tokenizer may not contain '..'"}]),
        description=(
            "How the router cuts prompts into the engines' KV blocks, so their KV-cache events feed its prefix "
            "index and every replica sees what each engine holds: 'auto' (the served model's tokenizer and chat "
            "template from the Hugging Face Hub, with model.tokenSecret and engine.env's HF_ENDPOINT; the "
            "emulator's own tokens for the emulator), 'hf:REPO[@REVISION]', a directory or tokenizer.json path "
            "inside the router image, or 'none' (byte blocks: engine events unused, each replica indexes its own "
            "routes). A tokenizer that cannot be fetched leaves the router routing as with 'none'."
        ),
    )

    data_parallel_routing: DataParallelRouting = Field(
        default="auto",
        description=(
            "How requests reach the ranks of a data-parallel replica (dataParallelSize > 1: one API server over "
            "several engines, each with its own prefix cache). 'ranks': the router routes to each rank with its "
            "own cache picture, load and KV events, and pins it with the X-data-parallel-rank header, which vLLM "
            "honours from v0.14.0; 'engine': the replica is one target and the engine picks the rank, blind to "
            "prompts; 'auto': 'ranks' for the emulator and for vLLM images tagged v0.14.0 or later, 'engine' for "
            "older vLLM (it reads the header and drops it), other tags and SGLang."
        ),
    )
    service: RouterServiceSpec = Field(
        default_factory=RouterServiceSpec, description="The router Service's type and annotations."
    )
    tls: RouterTls | None = Field(
        default=None, description="Serve HTTPS on port 8000 with this certificate; plain HTTP when omitted."
    )
    log_level: RouterLogLevel = Field(default="WARNING", description="The router's log level (--log-level).")
    handoff_slow_seconds: float | None = Field(
        default=None,
        ge=0,
        description=(
            "A prefill/decode pair whose streamed KV handoffs (prefill end to decode first byte) take longer than "
            "this, 3 in a row, is taken out of pairing for a cool-off, and the XpydKvHandoffSlow alert compares the "
            "pair's p99 with it (the router's --handoff-slow-seconds and xpyd_router_handoff_breakeven_seconds). "
            "Omitted: the break-even, the decode stall that disaggregation saves for a workload.promptTokens prompt "
            "(the DisaggregationWorthwhile condition's), where the model and topology are known; 0: off."
        ),
    )

    @field_validator("tokenizer")
    @classmethod
    def _no_parent_dirs(cls, value: str) -> str:
        if ".." in value:
            raise ValueError("router.tokenizer may not contain '..'")
        return value


class RatioBand(_Model):
    """Allowed prefill:decode replica ratio; the autoscaler raises the lagging pool to stay inside."""

    model_config = ConfigDict(
        json_schema_extra=cel([{"rule": "self.min <= self.max", "message": "ratioBand.min must be <= ratioBand.max"}])
    )

    min: float = Field(gt=0, description="Lowest prefill/decode replica ratio.")
    max: float = Field(gt=0, description="Highest prefill/decode replica ratio.")

    @model_validator(mode="after")
    def _check(self) -> RatioBand:
        if self.min > self.max:
            raise ValueError("ratioBand.min must be <= ratioBand.max")
        return self


class AutoscalingTargets(_Model):
    """Per-replica targets of the autoscaler's policy; omitted ones keep their defaults."""

    # The policy's Targets (xpyd_operator.autoscaling.types) extends this model, so a field added here
    # is a field the policy has; defaults are applied when the spec is read, never stored.

    prefill_waiting_per_replica: float = Field(
        default=2.0, gt=0, description="Queued requests (default 2).", json_schema_extra=_not_stored
    )
    prefill_running_per_replica: float | None = Field(default=None, gt=0, description="Running requests.")
    prefill_tokens_per_second_per_replica: float | None = Field(
        default=None, gt=0, description="Prompt tokens/s one prefill replica sustains (else learnt)."
    )
    prefill_utilization: float = Field(
        default=0.7, gt=0, le=1, description="Target share of that capacity.", json_schema_extra=_not_stored
    )
    decode_kv_usage: float = Field(
        default=0.7, gt=0, le=1, description="KV-cache usage (default 0.7).", json_schema_extra=_not_stored
    )
    decode_waiting_per_replica: float = Field(
        default=1.0, gt=0, description="Queued requests (default 1).", json_schema_extra=_not_stored
    )
    decode_running_per_replica: float | None = Field(default=None, gt=0, description="Running requests.")
    ttft_p90_seconds: float = Field(
        default=2.0, gt=0, description="TTFT p90 SLO; a breach adds a replica.", json_schema_extra=_not_stored
    )
    itl_p90_seconds: float = Field(
        default=0.1, gt=0, description="ITL p90 SLO; a breach adds a replica.", json_schema_extra=_not_stored
    )


class AutoscalingSpec(_Model):
    enabled: bool = False
    prometheus_url: str = "http://prometheus-operated.monitoring:9090"  # the Prometheus Operator's Service
    interval_seconds: int = Field(default=15, ge=1)
    stabilization_seconds: int = Field(
        default=300, ge=0, description="Scale down only to the highest recommendation of this window."
    )
    stale_after_seconds: int | None = Field(
        default=None, ge=1, description="Ignore samples older than this (default max(60, 4 x interval))."
    )
    ratio_band: RatioBand | None = None
    targets: AutoscalingTargets = Field(default_factory=AutoscalingTargets)

    def stale_after(self) -> float:
        """Seconds after which a sample counts as missing: staleAfterSeconds, else max(60, 4 x interval)."""
        return float(self.stale_after_seconds or max(60, 4 * self.interval_seconds))


SLO_PERCENTILES: Final = (90, 95, 99)


class SloSpec(_Model):
    """What the user asks of latency; set, it makes the autoscaler size both pools for it (the SLO policy)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [{"rule": "self.percentile in [90, 95, 99]", "message": "slo.percentile must be 90, 95 or 99"}]
        )
    )

    ttft_seconds: float = Field(gt=0, le=600, description="Time to first token at the percentile, in seconds.")
    itl_seconds: float = Field(gt=0, le=10, description="Inter-token latency at the percentile, in seconds.")
    percentile: int = Field(default=95, description="The percentile both targets hold at: 90, 95 or 99.")
    attainment: float = Field(
        default=0.99, gt=0, le=1, description="Share of requests that must meet both targets (default 0.99)."
    )

    @field_validator("percentile")
    @classmethod
    def _percentile(cls, v: int) -> int:
        if v not in SLO_PERCENTILES:
            raise ValueError(f"slo.percentile must be 90, 95 or 99, got {v}")
        return v


class RolloutSpec(_Model):
    """How an engine change (a new engine revision: image, connector, block size, KV dtype, parallelism) rolls."""

    max_surge: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Replicas per pool started on the new engine revision before any old one goes, so both "
        "revisions keep prefill/decode pairs; surge replicas the scheduler cannot place are dropped and the roll "
        "goes on in place. 0: in place from the start. A LeaderWorkerSet pool's replica is a group of pods.",
    )
    rollback: bool = Field(
        default=True,
        description="Roll a new engine revision back when one of its pods restarts 3 times, and do not try "
        "it again until the spec asks for another revision.",
    )


class WorkloadSpec(_Model):
    prompt_tokens: int = Field(
        default=4096, ge=1, description="Typical prompt length, for the disaggregation break-even check."
    )


def _engine_memory_limit(patch: dict[str, Any] | None) -> str | None:
    """resources.limits.memory of the engine container in a pod template patch, if it sets one."""
    containers = ((patch or {}).get("spec") or {}).get("containers") or []
    for c in containers:
        if isinstance(c, dict) and c.get("name") == ENGINE_CONTAINER:
            limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit is not None else None
    return None


class DisaggregatedDeploymentSpec(_Model):
    model_config = ConfigDict(json_schema_extra=cel(SPEC_RULES))

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec, json_schema_extra={"default": {}})
    mode: Mode = "Disaggregated"
    topology: TopologySpec = Field(default_factory=TopologySpec, json_schema_extra={"default": {}})
    prefill: PoolSpec | None = None
    decode: PoolSpec | None = None
    worker: PoolSpec | None = Field(default=None, description="The single pool of Colocated mode.")
    router: RouterSpec = Field(default_factory=RouterSpec, json_schema_extra={"default": {}})
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, json_schema_extra={"default": {}})
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, json_schema_extra={"default": {}})
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra={"default": {}})
    slo: SloSpec | None = Field(
        default=None,
        description="Latency targets; set (with autoscaling enabled), the autoscaler sizes the pools to meet them.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        description="Secrets (this namespace) for pulling engine and router images; added to the operator's own.",
    )
    network: NetworkSpec | None = Field(
        default=None, description="RDMA fabric of engine pods; default: the operator's --default-network, else None."
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, json_schema_extra={"default": {}})
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        json_schema_extra={"default": {}},
        description="NetworkPolicies the operator generates for the deployment's pods (off unless enabled).",
    )
    pod_template_patch: dict[str, Any] | None = template_patch_field("every engine")

    @model_validator(mode="after")
    def _check(self) -> DisaggregatedDeploymentSpec:
        pools = {r: (p.gpus_per_replica, p.data_parallel_size) for r, p in self.pools().items()}
        check_spec(self.mode, self.topology.kind, pools)
        checked_patch(self.pod_template_patch, "podTemplatePatch")
        if self.model.token_secret is not None and any(e.name == HF_TOKEN for e in self.engine.env):
            raise SpecError(f"{HF_TOKEN} is set twice: by model.tokenSecret and in engine.env; keep one")
        for role, pool in self.pools().items():
            if pool.kv_offload is not None:
                self._check_kv_offload(role, pool, pool.kv_offload)
        return self

    def _check_kv_offload(self, role: str, pool: PoolSpec, offload: KvOffloadSpec) -> None:
        """A release that cannot render the tier, or a patched memory limit below the pod's share of it."""
        try:
            profile = engine_profiles.resolve(self.engine.kind, self.engine.image, self.engine.version)
        except engine_profiles.EngineUnsupported:
            return  # the operator reports the engine itself (EngineUnsupported)
        where = f"{role}.kvOffload"
        if (problem := engine_profiles.kv_offload_problem(profile, where, offload.backend, offload.disk)) is not None:
            raise SpecError(problem)
        share = -(-offload.cpu_bytes // pool.layout(self.topology.hardware).pods)
        for field, patch in (("podTemplatePatch", self.pod_template_patch), (f"{role}.podTemplatePatch",
                                                                               pool.pod_template_patch)):  # fmt: skip
            limit = _engine_memory_limit(patch)
            if limit is not None and (quantity_bytes(limit) or 0) < share:
                raise SpecError(
                    f"{field} limits the engine's memory to {limit}, below {where}.cpuMemory's "
                    f"{bytes_quantity(share)} per pod; raise the limit or shrink cpuMemory"
                )

    def pools(self) -> dict[str, PoolSpec]:
        """The pools this spec asks for, by role (prefill/decode, or worker when Colocated)."""
        named = {"prefill": self.prefill, "decode": self.decode, "worker": self.worker}
        return {role: pool for role, pool in named.items() if pool is not None}

    def layouts(self) -> dict[str, ReplicaLayout]:
        """Each pool's replica layout on this spec's topology."""
        return {role: pool.layout(self.topology.hardware) for role, pool in self.pools().items()}


class Condition(_Model):
    type: str
    status: ConditionStatus
    reason: str = Field(min_length=1)
    message: str = ""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None


class PoolStatus(_Model):
    replicas: int = 0
    ready_replicas: int = 0
    pods_per_replica: int | None = Field(
        default=None, description="Pods of one replica when it spans nodes (a LeaderWorkerSet group); else omitted."
    )
    images: dict[str, int] | None = Field(
        default=None, description="Engine image -> ready pods serving it; two entries while an upgrade rolls."
    )
    revisions: dict[str, int] | None = Field(
        default=None,
        description="Engine revision (pod label xpyd.io/engine-rev) -> ready pods; a revision pairs where both "
        "pools have one.",
    )


class Placement(_Model):
    cliques: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    kv_path: KvPath = "Unknown"


class DisaggregatedDeploymentStatus(_Model):
    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = None
    xpyd: str | None = None
    layout: str | None = Field(default=None, description="Pods x GPUs of one replica per pool, e.g. 'P 4x8 GPUs'.")
    prefill: PoolStatus | None = None
    decode: PoolStatus | None = None
    worker: PoolStatus | None = None
    router: PoolStatus | None = None
    placement: Placement | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    autoscaler: dict[str, Any] | None = Field(
        default=None,
        description="Written by the autoscaler (its own field manager).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    @classmethod
    def read(cls, raw: Any) -> DisaggregatedDeploymentStatus:
        """The status as stored; a garbled one (a hand edit) reads as empty and is rewritten."""
        try:
            return cls.model_validate(raw or {})
        except ValidationError:
            return cls()


class DisaggregatedDeployment(_Model):
    """The whole object as stored; metadata stays a plain mapping."""

    model_config = ConfigDict(json_schema_extra=cel(ROOT_RULES))

    api_version: str = "xpyd.io/v1alpha1"
    kind: str = "DisaggregatedDeployment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: DisaggregatedDeploymentSpec
    status: DisaggregatedDeploymentStatus | None = None
