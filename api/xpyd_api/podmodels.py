"""The parts of the API that shape a real engine pod: Secret references, the model cache, the network
profile, the user's scheduling and pod template patches (docs/configure.md)."""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from xpyd_api import fabrics, podpatch
from xpyd_api.apibase import FREE_FORM, QUANTITY, ApiModel, cel

DEFAULT_CACHE_PATH: Final = "/model-cache"


class SecretKeySelector(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="A Secret in the deployment's namespace.")
    key: str = Field(min_length=1, description="The key of the Secret's data to read.")

    def env(self, name: str) -> dict[str, Any]:
        """A container env entry `name` read from this Secret key (never a literal in the pod spec)."""
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": self.name, "key": self.key}}}


class PersistentVolumeClaimSource(ApiModel):
    claim_name: str = Field(min_length=1, max_length=253, description="A PVC in the deployment's namespace.")
    read_only: bool = Field(
        default=False, description="Mount read-only (a pre-filled cache); the engines then never download."
    )


class HostPathSource(ApiModel):
    path: str = Field(pattern=r"^/", description="A folder on every GPU node, e.g. /var/lib/models (local NVMe).")
    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(
        default="DirectoryOrCreate", description="Kubernetes' hostPath type check."
    )


class EmptyDirSource(ApiModel):
    size_limit: str | None = Field(
        default=None, pattern=QUANTITY, description="Evict the pod beyond this, e.g. 500Gi; the default cache's size."
    )


class ModelCache(ApiModel):
    """Where the engines keep downloaded weights (HF_HOME): exactly one volume source."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [
                {
                    "rule": "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0)"
                    " + (has(self.emptyDir) ? 1 : 0) == 1",
                    "message": "model.cache takes exactly one of persistentVolumeClaim, hostPath, emptyDir",
                }
            ]
        )
    )

    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        default=None, description="A PVC (ReadWriteMany, or ReadOnlyMany once filled) shared by every replica."
    )
    host_path: HostPathSource | None = Field(
        default=None, description="A node folder; Pod Security level privileged (hostPath volumes)."
    )
    empty_dir: EmptyDirSource | None = Field(
        default=None, description="Per pod: survives container restarts, not rescheduling."
    )
    mount_path: str = Field(
        default=DEFAULT_CACHE_PATH, pattern=r"^/", description="Where it is mounted; HF_HOME points here."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelCache:
        sources = [self.persistent_volume_claim, self.host_path, self.empty_dir]
        if sum(s is not None for s in sources) != 1:
            raise ValueError("model.cache takes exactly one of persistentVolumeClaim, hostPath, emptyDir")
        return self

    @property
    def read_only(self) -> bool:
        return self.persistent_volume_claim is not None and self.persistent_volume_claim.read_only


_ADDITIONS: Final = ("resources", "annotations", "env", "capabilities")


class NetworkSpec(ApiModel):
    """The fabric engine pods use for the KV handoff and collectives: a profile plus your own additions."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            [
                {
                    "rule": f"self.profile != '{fabrics.NONE}' || ("
                    + " && ".join(f"(!has(self.{f}) || self.{f}.size() == 0)" for f in _ADDITIONS)
                    + " && !has(self.devicesPerGpu))",
                    "message": f"network profile {fabrics.NONE} takes no additions; use {fabrics.CUSTOM}",
                }
            ]
        )
    )

    profile: str = Field(
        description=" | ".join(fabrics.PROFILES) + ": the fabric's ready-made resources, annotations and env.",
        json_schema_extra={"enum": list(fabrics.PROFILES)},
    )
    devices_per_gpu: int | None = Field(
        default=None, ge=1, le=16, description="NICs per GPU for per-NIC resources (RoCE, GKE-RDMA, AWS-EFA); 1."
    )
    resources: dict[str, str] = Field(
        default_factory=dict, description="Device resources per pod, e.g. {rdma/hca_shared_devices_a: '1'}."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Pod annotations, e.g. k8s.v1.cni.cncf.io/networks for Multus."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Engine environment, e.g. UCX_NET_DEVICES.")
    capabilities: list[str] = Field(default_factory=list, description="Capabilities to add, e.g. SYS_RAWIO.")

    @field_validator("profile")
    @classmethod
    def _known(cls, profile: str) -> str:
        if profile not in fabrics.PROFILES:
            raise ValueError(f"network.profile must be one of {', '.join(fabrics.PROFILES)}, got {profile!r}")
        return profile

    @field_validator("capabilities")
    @classmethod
    def _caps(cls, caps: list[str]) -> list[str]:
        bad = [c for c in caps if c == "ALL" or not c.replace("_", "").isalpha() or not c.isupper()]
        if bad:
            raise ValueError(f"capabilities are names such as IPC_LOCK or SYS_RAWIO (without CAP_), got {bad}")
        return caps

    @field_validator("resources")
    @classmethod
    def _quantities(cls, resources: dict[str, str]) -> dict[str, str]:
        bad = {k: v for k, v in resources.items() if not re.fullmatch(QUANTITY, v)}
        if bad:
            raise ValueError(f"network.resources values are quantities such as '1' or '8', got {bad}")
        return resources

    @classmethod
    def parse(cls, text: str) -> NetworkSpec | None:
        """A profile name (InfiniBand) or a JSON object ({"profile": "RoCE", ...}); None for an empty text."""
        text = text.strip()
        if not text:
            return None
        if text.startswith("{"):
            return cls.model_validate_json(text)
        return cls(profile=text)

    @model_validator(mode="after")
    def _none_is_empty(self) -> NetworkSpec:
        extra = self.resources or self.annotations or self.env or self.capabilities or self.devices_per_gpu
        if self.profile == fabrics.NONE and extra:
            raise ValueError(f"network profile {fabrics.NONE} takes no additions; use {fabrics.CUSTOM}")
        return self


class Toleration(ApiModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class SchedulingSpec(ApiModel):
    """Your own scheduling rules for every engine pod, added to the operator's (topology, clique, GPUs)."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Added to the topology's selector, e.g. a node pool label."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Added to the GPU (and arm64) tolerations, e.g. a dedicated taint."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="nodeAffinity terms are ANDed with the clique pin; podAffinity and podAntiAffinity as written.",
        json_schema_extra=FREE_FORM,
    )
    priority_class_name: str | None = Field(default=None, description="The pods' PriorityClass.")

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
        allowed = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
        unknown = sorted(set(affinity or {}) - allowed)
        if unknown:
            raise ValueError(f"scheduling.affinity takes {', '.join(sorted(allowed))}; unknown: {unknown}")
        return affinity


def checked_patch(patch: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """The patch when it can apply to an engine pod template; else a ValueError naming every problem."""
    if patch is None:
        return None
    errors = podpatch.check(patch, where)
    if errors:
        raise ValueError("; ".join(errors))
    return patch


def template_patch_field(scope: str) -> Any:
    return Field(
        default=None,
        description=f"A strategic-merge-like patch on {scope} pod template ({{metadata, spec}}), applied last.",
        json_schema_extra=FREE_FORM,
    )
