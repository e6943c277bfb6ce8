"""Label, annotation and topology keys: the one place every component reads them from."""

from __future__ import annotations

from typing import Final, Literal

GROUP: Final = "xpyd.io"
VERSION: Final = "v1alpha1"
KIND: Final = "DisaggregatedDeployment"
PLURAL: Final = "disaggregateddeployments"

# Labels the operator puts on every child and pod it makes.
DEPLOYMENT: Final = "xpyd.io/deployment"  # value: the DisaggregatedDeployment's name
ROLE: Final = "xpyd.io/role"  # value: one of Role
COMPONENT: Final = "app.kubernetes.io/component"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "xpyd-operator"  # also the server-side-apply field manager

Role = Literal["prefill", "decode", "worker", "router"]
ROLES: Final[tuple[Role, ...]] = ("prefill", "decode", "worker", "router")

# Node labels from NVIDIA GPU Feature Discovery (DESIGN.md section 4).
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
GPU_COUNT: Final = "nvidia.com/gpu.count"
GPU_CLIQUE: Final = "nvidia.com/gpu.clique"
GPU_RESOURCE: Final = "nvidia.com/gpu"
HOSTNAME: Final = "kubernetes.io/hostname"
ARCH: Final = "kubernetes.io/arch"

PRODUCT_B200: Final = "NVIDIA-B200"
PRODUCT_GB200: Final = "NVIDIA-GB200"
PRODUCT_H100: Final = "NVIDIA-H100-80GB-HBM3"

# Environment a worker pod gets so it knows its NVLink domain (node name on HGX,
# clique id on NVL72); the emulator uses it to model the KV handoff path.
ENV_NODE_NAME: Final = "XPYD_NODE_NAME"
ENV_NVLINK_DOMAIN: Final = "XPYD_NVLINK_DOMAIN"
ENV_GPU: Final = "XPYD_GPU"


def nvlink_domain(node_name: str, node_labels: dict[str, str]) -> str:
    """The NVLink domain of a node: its clique on NVL72 racks, else the node itself."""
    return node_labels.get(GPU_CLIQUE) or node_name


# --- appended by the operator (issue 4) ---
# Pod label with the NVLink domain the operator pinned the pod to (an NVL72 clique). Pods without
# it: on HGX the domain is the pod's node (pod.spec.nodeName), elsewhere unknown.
NVLINK_DOMAIN_LABEL: Final = "xpyd.io/nvlink-domain"
APPLIED_HASH: Final = "xpyd.io/applied-hash"  # annotation: hash of the manifest the operator last applied
APP_NAME: Final = "app.kubernetes.io/name"
ENV_ROLE: Final = "XPYD_ROLE"
ENV_DEPLOYMENT: Final = "XPYD_DEPLOYMENT"
ENV_ROUTER_POLICY: Final = "XPYD_ROUTER_POLICY"  # kv-aware | least-loaded | round-robin
ENV_NIXL_HOST: Final = "VLLM_NIXL_SIDE_CHANNEL_HOST"
ENV_NIXL_PORT: Final = "VLLM_NIXL_SIDE_CHANNEL_PORT"
ENGINE_PORT: Final = 8000
NIXL_PORT: Final = 5600
ROUTER_PORT: Final = 8000
OWN_IMAGE: Final = "ghcr.io/xpyd/xpyd"
