"""Least privilege for every pod the operator makes: security contexts per engine and fabric, pull secrets.

docs/security.md states the Pod Security Standards level each kind of pod meets; the tests hold the
builders to it and e2e/test_pod_security.py lets a real API server's PodSecurity admission judge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import engines

RUN_AS: Final = 65532  # the xpyd image's numeric user and group (Dockerfile `USER 65532:65532`)
TMP_VOLUME: Final = "tmp"
TMP_SIZE: Final = "256Mi"
TMP_PATH: Final = "/tmp"  # in the container: the emptyDir's mount

# Device resources that register host memory with an RDMA NIC, by exact name or by prefix ending in
# "/": pinning that memory beyond RLIMIT_MEMLOCK needs CAP_IPC_LOCK (llm-d, Dynamo and RoleBasedGroup
# add it for the same resources). Nothing else about a fabric needs a capability: NVLink within a node
# and MNNVL through a ComputeDomain's IMEX channel (a DRA claim) need none.
FABRIC_CAPABILITIES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("rdma/", ("IPC_LOCK",)),  # k8s-rdma-shared-dev-plugin, SR-IOV RDMA: rdma/ib, rdma/hca, rdma/roce_gdr, ...
    ("nvidia.com/hostdev", ("IPC_LOCK",)),  # NVIDIA Network Operator host-device / SR-IOV VFs
    ("vpc.amazonaws.com/efa", ("IPC_LOCK",)),  # AWS EFA device plugin
)

# Engines that run the xpyd image (a known non-root user, nothing written outside /tmp) meet the
# `restricted` level; vLLM's and SGLang's images run as root and write under $HOME, so their pods
# keep the user and filesystem the image chose and drop everything else (`baseline`).


def own_image_engine(spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether the engine pods run the operator's own image (the emulator), as the engine seam says."""
    return engines.renderer(spec.engine.kind).own_image()


def restricted_pod_context() -> dict[str, Any]:
    """Pod-level context of the `restricted` Pod Security level for the xpyd image."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_context() -> dict[str, Any]:
    """Container-level context of the `restricted` level, with a read-only root filesystem."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def tmp_volume() -> dict[str, Any]:
    """A small writable /tmp for containers whose root filesystem is read-only."""
    return {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": TMP_SIZE}}


def tmp_mount() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "mountPath": TMP_PATH}


def fabric_capabilities(resources: Iterable[str]) -> list[str]:
    """Capabilities the requested device resources need (sorted, unique); empty for none."""
    out: set[str] = set()
    for resource in resources:
        for name, caps in FABRIC_CAPABILITIES:
            if resource == name or (name.endswith("/") and resource.startswith(name)):
                out.update(caps)
    return sorted(out)


def engine_pod_context(spec: DisaggregatedDeploymentSpec) -> dict[str, Any]:
    """Pod-level context of an engine pod: RuntimeDefault seccomp always, a non-root user on our image."""
    if own_image_engine(spec):
        return restricted_pod_context()
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def engine_container_context(spec: DisaggregatedDeploymentSpec, resources: Mapping[str, Any]) -> dict[str, Any]:
    """Container-level context of an engine: no privilege escalation, every capability dropped but the
    ones its fabric's device resources need (IPC_LOCK for RDMA), read-only root on our image."""
    context = restricted_container_context()
    if not own_image_engine(spec):
        del context["readOnlyRootFilesystem"]
    add = fabric_capabilities(resources)
    if add:
        context["capabilities"] = {"drop": ["ALL"], "add": add}
    return context


def pull_secret_names(operator_wide: Iterable[str], spec: DisaggregatedDeploymentSpec) -> list[str]:
    """The operator's pull secrets then the deployment's own, each once, in order."""
    names = [*operator_wide, *(ref.name for ref in spec.image_pull_secrets)]
    return list(dict.fromkeys(n for n in names if n))


def with_pull_secrets(manifest: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The manifest with imagePullSecrets on its pod template, when it has one and names is not empty."""
    pod = manifest.get("spec", {}).get("template", {}).get("spec")
    if pod is not None and names:
        pod["imagePullSecrets"] = [{"name": n} for n in names]
    return manifest
