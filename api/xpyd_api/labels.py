"""Label, annotation, environment and port names: the one place every component reads them from."""

from __future__ import annotations

from typing import Final, Literal

from xpyd_perf.topology import ARCH as ARCH
from xpyd_perf.topology import GPU_CLIQUE as GPU_CLIQUE
from xpyd_perf.topology import GPU_COUNT as GPU_COUNT
from xpyd_perf.topology import GPU_PRODUCT as GPU_PRODUCT

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

# Node labels from NVIDIA GPU Feature Discovery (docs/install.md, step 1) live with the topology table
# (xpyd_perf.topology), which says which values each kind of node carries; re-exported here.
GPU_RESOURCE: Final = "nvidia.com/gpu"
HOSTNAME: Final = "kubernetes.io/hostname"

# Environment a worker pod gets so it knows its NVLink domain (node name on HGX,
# clique id on NVL72); the emulator uses it to model the KV handoff path.
ENV_NODE_NAME: Final = "XPYD_NODE_NAME"
ENV_NVLINK_DOMAIN: Final = "XPYD_NVLINK_DOMAIN"
ENV_GPU: Final = "XPYD_GPU"


def nvlink_domain(node_name: str, node_labels: dict[str, str]) -> str:
    """The NVLink domain of a node: its clique on NVL72 racks, else the node itself."""
    return node_labels.get(GPU_CLIQUE) or node_name


# Pod label with the NVLink domain the operator pinned the pod to (an NVL72 clique). Pods without
# it: on HGX the domain is the pod's node (pod.spec.nodeName), elsewhere unknown.
NVLINK_DOMAIN_LABEL: Final = "xpyd.io/nvlink-domain"
ENGINE_REV: Final = (
    "xpyd.io/engine-rev"  # pod label: hash of the handoff facts (xpyd_api.handoff); the router pairs equal ones
)
ENV_ENGINE_REV: Final = "XPYD_ENGINE_REV"  # the emulator's own revision (that label, by the downward API)
ENV_ENGINE_VERSION: Final = "XPYD_ENGINE_VERSION"  # the release an emulator stands in for (its image's tag)
APPLIED_HASH: Final = "xpyd.io/applied-hash"  # annotation: hash of the manifest the operator last applied
APP_NAME: Final = "app.kubernetes.io/name"
ENV_ROLE: Final = "XPYD_ROLE"
ENV_DEPLOYMENT: Final = "XPYD_DEPLOYMENT"
ENV_ROUTER_POLICY: Final = "XPYD_ROUTER_POLICY"  # kv-aware | least-loaded | round-robin
ENV_ROUTER_API_KEY: Final = "XPYD_ROUTER_API_KEY"  # standalone routers: the bearer key without --api-key-file
ENV_NIXL_HOST: Final = "VLLM_NIXL_SIDE_CHANNEL_HOST"
ENV_NIXL_PORT: Final = "VLLM_NIXL_SIDE_CHANNEL_PORT"

# Ports every component agrees on.
ENGINE_PORT: Final = 8000
NIXL_PORT: Final = 5600  # vLLM's NIXL side channel
SGLANG_BOOTSTRAP_PORT: Final = 8998  # SGLang's prefill bootstrap server
KV_EVENTS_PORT: Final = 5557  # the engine's KV-cache event publisher (ZMQ PUB; vLLM's default)
KV_REPLAY_PORT: Final = 5657  # its replay socket (ZMQ ROUTER); +100 so data-parallel ranks (port + rank) never clash
# data-parallel rank r publishes on both ports + r (vLLM): more ranks than the gap on one host would collide
MAX_DATA_PARALLEL: Final = KV_REPLAY_PORT - KV_EVENTS_PORT
# Annotations on the pod that serves a data-parallel replica's API: the router subscribes to rank r's events on
# pod r // local of the group, port + r; with routing "ranks" it routes to each rank (X-data-parallel-rank), with
# "engine" the replica is one target whose engine balances the ranks.
DATA_PARALLEL_SIZE: Final = "xpyd.io/data-parallel-size"
DATA_PARALLEL_LOCAL: Final = "xpyd.io/data-parallel-size-local"
DATA_PARALLEL_ROUTING: Final = "xpyd.io/data-parallel-routing"
KV_EVENTS_PORT_NAME: Final = "kv-events"  # container port names the router's discovery looks for
KV_REPLAY_PORT_NAME: Final = "kv-replay"
KV_SIDE_PORT_NAME: Final = "kv-side"  # the handoff's side channel (NIXL_PORT) on prefill and decode pods
BOOTSTRAP_PORT_NAME: Final = "bootstrap"  # SGLang's bootstrap server on prefill pods
RANK_JOIN_PORT_NAME: Final = "rank-join"  # where a multi-node replica's other ranks meet its leader
KV_EVENTS_TOPIC: Final = "kv-events"
ROUTER_PORT: Final = 8000
OWN_IMAGE: Final = "ghcr.io/xpyd/xpyd"

# LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): a multi-node replica is one group of pods. The LWS
# controller and its pod webhook put these labels, annotation and environment on every pod of a group.
LWS_GROUP: Final = "leaderworkerset.x-k8s.io"
LWS_VERSION: Final = "v1"
LWS_PLURAL: Final = "leaderworkersets"
LWS_NAME: Final = "leaderworkerset.sigs.k8s.io/name"  # value: the LeaderWorkerSet's name
LWS_GROUP_INDEX: Final = "leaderworkerset.sigs.k8s.io/group-index"  # which replica (group)
LWS_WORKER_INDEX: Final = "leaderworkerset.sigs.k8s.io/worker-index"  # rank of the pod in its group; 0 = leader
LWS_GROUP_KEY: Final = "leaderworkerset.sigs.k8s.io/group-key"  # unique per group incarnation
LWS_SIZE: Final = "leaderworkerset.sigs.k8s.io/size"  # pod annotation: pods per group
ENV_LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"  # <lws>-<group>.<lws>.<namespace>
ENV_LWS_GROUP_SIZE: Final = "LWS_GROUP_SIZE"
ENV_LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"
DP_RPC_PORT: Final = 29550  # vLLM's --data-parallel-rpc-port default: the ranks of a group meet the leader here
SGLANG_DIST_PORT: Final = 20000  # SGLang's --dist-init-addr port (the references' choice)
# The local cluster has no DNS: its kubelet writes pod host names (hostname.subdomain.namespace[.svc...])
# to a hosts file and names it in this variable; the emulator resolves through it first. Unset elsewhere.
ENV_HOSTS_FILE: Final = "XPYD_HOSTS_FILE"
