"""The DisaggregatedDeployment API (xpyd.io/v1alpha1): the one source of truth for CRD and operator."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from xpyd_api.rules import POOL_RULES, ROOT_RULES, SPEC_RULES, check_pool, check_spec

EngineKind = Literal["vllm", "sglang", "emulator"]
TopologyKind = Literal["HGX-B200", "GB200-NVL72", "Any"]
Mode = Literal["Disaggregated", "Colocated"]
RouterPolicy = Literal["kv-aware", "least-loaded", "round-robin"]
ConditionStatus = Literal["True", "False", "Unknown"]
KvPath = Literal["NVLink", "RDMA", "Local", "Unknown"]


def _cel(rules: list[dict[str, str]]) -> dict[str, Any]:
    return {"x-kubernetes-validations": rules}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid")


class ModelSpec(_Model):
    """The served model."""

    name: str = Field(min_length=1, description="Model to serve, e.g. meta-llama/Llama-3.1-70B-Instruct.")
    kv_bytes_per_token: int | None = Field(
        default=None, ge=1, description="KV-cache bytes per token; omit to look the model up in the catalog."
    )


class EnvVar(_Model):
    name: str = Field(min_length=1)
    value: str = ""


class EngineSpec(_Model):
    """The inference engine every worker pod runs."""

    kind: EngineKind = Field(
        default="vllm", description="vllm | sglang | emulator (xpyd's vLLM emulator, for GPU-less clusters)."
    )
    image: str | None = Field(default=None, description="Container image; a default per kind when omitted.")
    kv_connector: str = Field(default="NixlConnector", description="vLLM KV connector for the handoff.")
    args: list[str] = Field(default_factory=list, description="Extra engine arguments, appended.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for engine containers.")
    resources: dict[str, str] = Field(
        default_factory=dict, description="Extra resource requests, e.g. {cpu: '16', memory: 200Gi}."
    )
    drain_seconds: int = Field(
        default=120, ge=0, le=3600, description="Grace period for in-flight requests on pod termination."
    )


class PoolAutoscaling(_Model):
    model_config = ConfigDict(json_schema_extra=_cel(POOL_RULES["autoscaling"]))

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)


class PoolSpec(_Model):
    """One pool of identical engine replicas (a StatefulSet)."""

    model_config = ConfigDict(json_schema_extra=_cel(POOL_RULES["pool"]))

    replicas: int | None = Field(
        default=None, ge=0, description="Omit to leave replicas to an external scaler (HPA, KEDA, xpyd)."
    )
    gpus_per_replica: int = Field(default=1, ge=0, le=72, description="GPUs of one replica (one pod).")
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, description="Tensor-parallel size; defaults to gpusPerReplica."
    )
    args: list[str] = Field(default_factory=list, description="Extra engine arguments for this pool only.")
    autoscaling: PoolAutoscaling | None = None

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        scaling = self.autoscaling
        check_pool(self.replicas, (scaling.min_replicas, scaling.max_replicas) if scaling else None)
        return self

    @property
    def tp(self) -> int:
        return self.tensor_parallel_size or max(1, self.gpus_per_replica)


class TopologySpec(_Model):
    kind: TopologyKind = Field(default="Any", description="HGX-B200 | GB200-NVL72 | Any (pins nothing).")


class RouterSpec(_Model):
    replicas: int = Field(default=1, ge=0)
    policy: RouterPolicy = "kv-aware"
    image: str | None = Field(default=None, description="Router image; the operator's default when omitted.")


class RatioBand(_Model):
    """Allowed prefill:decode replica ratio; the autoscaler raises the lagging pool to stay inside."""

    model_config = ConfigDict(
        json_schema_extra=_cel([{"rule": "self.min <= self.max", "message": "ratioBand.min must be <= ratioBand.max"}])
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

    prefill_waiting_per_replica: float | None = Field(default=None, gt=0, description="Queued requests (default 2).")
    prefill_running_per_replica: float | None = Field(default=None, gt=0, description="Running requests.")
    prefill_tokens_per_second_per_replica: float | None = Field(
        default=None, gt=0, description="Prompt tokens/s one prefill replica sustains (else learnt)."
    )
    prefill_utilization: float | None = Field(default=None, gt=0, le=1, description="Target share of that capacity.")
    decode_kv_usage: float | None = Field(default=None, gt=0, le=1, description="KV-cache usage (default 0.7).")
    decode_waiting_per_replica: float | None = Field(default=None, gt=0, description="Queued requests (default 1).")
    decode_running_per_replica: float | None = Field(default=None, gt=0, description="Running requests.")
    ttft_p90_seconds: float | None = Field(default=None, gt=0, description="TTFT p90 SLO; a breach adds a replica.")
    itl_p90_seconds: float | None = Field(default=None, gt=0, description="ITL p90 SLO; a breach adds a replica.")


class AutoscalingSpec(_Model):
    enabled: bool = False
    prometheus_url: str = "http://prometheus.monitoring:9090"
    interval_seconds: int = Field(default=15, ge=1)
    stabilization_seconds: int = Field(
        default=300, ge=0, description="Scale down only to the highest recommendation of this window."
    )
    stale_after_seconds: int | None = Field(
        default=None, ge=1, description="Ignore samples older than this (default max(60, 4 x interval))."
    )
    ratio_band: RatioBand | None = None
    targets: AutoscalingTargets | None = None


class WorkloadSpec(_Model):
    prompt_tokens: int = Field(
        default=4096, ge=1, description="Typical prompt length, for the disaggregation break-even check."
    )


class DisaggregatedDeploymentSpec(_Model):
    model_config = ConfigDict(json_schema_extra=_cel(SPEC_RULES))

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

    @model_validator(mode="after")
    def _check(self) -> DisaggregatedDeploymentSpec:
        pools = {r: p.gpus_per_replica for r, p in self.pools().items()}
        check_spec(self.mode, self.topology.kind, pools)
        return self

    def pools(self) -> dict[str, PoolSpec]:
        """The pools this spec asks for, by role (prefill/decode, or worker when Colocated)."""
        named = {"prefill": self.prefill, "decode": self.decode, "worker": self.worker}
        return {role: pool for role, pool in named.items() if pool is not None}


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


class Placement(_Model):
    cliques: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    kv_path: KvPath = "Unknown"


class DisaggregatedDeploymentStatus(_Model):
    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = None
    xpyd: str | None = None
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


class DisaggregatedDeployment(_Model):
    """The whole object as stored; metadata stays a plain mapping."""

    model_config = ConfigDict(json_schema_extra=_cel(ROOT_RULES))

    api_version: str = "xpyd.io/v1alpha1"
    kind: str = "DisaggregatedDeployment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: DisaggregatedDeploymentSpec
    status: DisaggregatedDeploymentStatus | None = None
