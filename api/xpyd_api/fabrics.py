"""Network profiles: what an engine pod needs to move KV caches and collectives over each RDMA fabric.

One table, asked by the operator (spec.network.profile, or the operator's --default-network) and
printed in docs/configure.md. Each profile names the device-plugin resource a pod requests, the
secondary-network annotations, the environment UCX (NIXL's transport), NCCL and libfabric read,
and the capabilities memory registration needs. Sources: llm-d's pd-disaggregation and wide-ep
guides, NVIDIA Dynamo's recipes/addons/providers (aks-ib, nebius-ib, gke-roce, aws-efa) and the
NVIDIA Network Operator's RDMA shared device plugin. Names a cluster chooses itself (a Multus
NetworkAttachmentDefinition, its own resource name) go in spec.network's own fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

NONE: Final = "None"
CUSTOM: Final = "Custom"
PRIMARY_IFACE: Final = "eth0"  # the pod network: NCCL's, Gloo's and NVSHMEM's bootstrap sockets stay on it
# Bootstrap sockets on the pod network; without them NCCL may pick a secondary NIC without a route.
_SOCKETS: Final = {
    "NCCL_SOCKET_IFNAME": PRIMARY_IFACE,
    "GLOO_SOCKET_IFNAME": PRIMARY_IFACE,
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": PRIMARY_IFACE,
}


@dataclass(frozen=True)
class FabricParts:
    """What one engine pod gets from its network profile."""

    resources: dict[str, str] = field(default_factory=dict)  # requested with an equal limit
    annotations: dict[str, str] = field(default_factory=dict)  # on the pod
    env: dict[str, str] = field(default_factory=dict)  # in the engine container
    capabilities: tuple[str, ...] = ()  # added to the engine container
    nixl_backends: tuple[str, ...] = ()  # vLLM NixlConnector kv_connector_extra_config.backends


@dataclass(frozen=True)
class Profile:
    name: str
    fabric: str  # what it is, for docs and status
    devices_per_gpu: int  # default NICs per GPU for profiles whose device resource counts NICs
    build: Callable[[int], FabricParts]  # NICs of the pod -> its parts

    def parts(self, gpus: int, devices_per_gpu: int | None = None) -> FabricParts:
        """The parts of a pod with `gpus` GPUs (devices_per_gpu overrides the profile's default)."""
        per = self.devices_per_gpu if devices_per_gpu is None else devices_per_gpu
        return self.build(max(1, gpus) * per)


def _nothing(nics: int) -> FabricParts:
    return FabricParts()


def _infiniband(nics: int) -> FabricParts:
    # The RDMA shared device plugin hands every HCA of the node to a pod for one slot: not per GPU.
    # UCX finds the HCAs itself (Dynamo nebius-ib/aks-ib leave UCX_NET_DEVICES to its probe).
    return FabricParts({"rdma/ib": "1"}, {}, dict(_SOCKETS), ("IPC_LOCK",))


def _roce(nics: int) -> FabricParts:
    # SR-IOV or host-device RoCE: one virtual function per NIC (llm-d on OpenShift: rdma/roce_gdr, one per GPU).
    return FabricParts({"rdma/roce_gdr": str(nics)}, {}, dict(_SOCKETS), ("IPC_LOCK",))


def _gke(nics: int) -> FabricParts:
    # GKE multi-networking (A4 B200, A4X GB200): one RDMA network per NIC, attached by the annotation
    # (Dynamo gke-roce, llm-d gke a4x); UCX over the mlx5 RoCE NICs plus NVLink and host memory.
    resources: dict[str, str] = {}
    interfaces = [{"interfaceName": PRIMARY_IFACE, "network": "default"}]
    for i in range(nics):
        resources[f"networking.gke.io.networks/rdma-{i}"] = "1"
        resources[f"networking.gke.io.networks/rdma-{i}.IP"] = "1"
        interfaces.append({"interfaceName": f"eth{i + 2}", "network": f"rdma-{i}"})
    annotations = {
        "networking.gke.io/default-interface": PRIMARY_IFACE,
        "networking.gke.io/interfaces": json.dumps(interfaces, separators=(",", ":")),
    }
    env = {**_SOCKETS, "UCX_TLS": "rc_mlx5,rc,cuda_copy,cuda_ipc,sm,shm,self", "NCCL_CROSS_NIC": "0"}
    return FabricParts(resources, annotations, env, ("IPC_LOCK", "NET_ADMIN"))


def _efa(nics: int) -> FabricParts:
    # AWS Elastic Fabric Adapter: libfabric instead of UCX, so NIXL needs its LIBFABRIC backend
    # (llm-d aws, Dynamo aws-efa); the image must carry the EFA libfabric.
    env = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "GLOO_SOCKET_IFNAME": PRIMARY_IFACE}
    return FabricParts({"vpc.amazonaws.com/efa": str(nics)}, {}, env, ("IPC_LOCK",), ("LIBFABRIC",))


PROFILES: Final[dict[str, Profile]] = {
    p.name: p
    for p in (
        Profile(NONE, "no RDMA: the KV handoff and collectives use the pod network (TCP)", 1, _nothing),
        Profile("InfiniBand", "InfiniBand through the NVIDIA Network Operator's RDMA shared device plugin", 1,
                _infiniband),
        Profile("RoCE", "RoCE through SR-IOV or host-device virtual functions, one per NIC", 1, _roce),
        Profile("GKE-RDMA", "GKE multi-networking: one RDMA network (rdma-0, rdma-1, ...) per NIC", 1, _gke),
        Profile("AWS-EFA", "AWS Elastic Fabric Adapter (libfabric)", 1, _efa),
        Profile(CUSTOM, "only what spec.network lists: resources, annotations, env, capabilities", 1, _nothing),
    )
}  # fmt: skip
