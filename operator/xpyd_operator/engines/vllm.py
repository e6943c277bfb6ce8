"""vLLM's command line, rank flags and environment, per release (the profile says what differs)."""

from __future__ import annotations

import json
from typing import Any, Final

from xpyd_api import fabrics
from xpyd_api import labels as L
from xpyd_api.engines import EngineProfile
from xpyd_api.layout import ReplicaLayout
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator.engine_ranks import LEADER_ADDRESS, WORKER_INDEX, Rank, Raw, Word
from xpyd_operator.engines import offload as kv_offload

# Wide expert parallelism (llm-d wide-ep-lws, Dynamo's GB200 recipe): DeepGEMM kernels, balanced dummy
# batches on idle data-parallel ranks, no peer-to-peer probe at start.
EXPERT_PARALLEL_ENV: Final = (
    ("VLLM_USE_DEEP_GEMM", "1"),
    ("VLLM_RANDOMIZE_DP_DUMMY_INPUTS", "1"),
    ("VLLM_SKIP_P2P_CHECK", "1"),
)
# The MoE all-to-all kernel by role (as llm-d's wide-EP guide runs it): DeepEP's throughput kernels for
# prefill's large batches, its low-latency kernels for decode. `--all2all-backend` where the release has
# it, VLLM_ALL2ALL_BACKEND before (a later release ignores that variable with only a warning).
ALL2ALL: Final = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}
ALL2ALL_FLAG: Final = "--all2all-backend"
ALL2ALL_ENV: Final = "VLLM_ALL2ALL_BACKEND"
# Keys of --kv-transfer-config the operator writes; spec.engine.kvTransferConfig may not set them.
OWN_KV_KEYS: Final = frozenset({"kv_connector", "kv_role"})


def nixl_backends(spec: DisaggregatedDeploymentSpec) -> tuple[str, ...]:
    """NIXL transports the network profile needs besides UCX's default (LIBFABRIC on AWS EFA)."""
    if spec.network is None or spec.engine.kv_connector != "NixlConnector":
        return ()
    return fabrics.PROFILES[spec.network.profile].parts(1).nixl_backends


def kv_transfer_config(
    spec: DisaggregatedDeploymentSpec, role: str, profile: EngineProfile, pool: PoolSpec | None = None
) -> str:
    """--kv-transfer-config: the connector, the pool's role in the handoff, then the user's extra keys; with
    the pool's kvOffload, a MultiConnector of that and the offloading connector."""
    config: dict[str, Any] = {"kv_connector": spec.engine.kv_connector, "kv_role": profile.kv_roles[role]}
    config.update(spec.engine.kv_transfer_config)
    if backends := nixl_backends(spec):
        extra = dict(config.get("kv_connector_extra_config") or {})
        extra.setdefault("backends", list(backends))
        config["kv_connector_extra_config"] = extra
    if pool is not None and (offload := kv_offload.checked(pool, role, profile)) is not None:
        config = kv_offload.multi_connector(config, kv_offload.vllm_connector(pool, offload))
    return json.dumps(config, separators=(",", ":"))


class VllmRenderer:
    """vLLM's OpenAI server (`vllm serve`)."""

    def argv(self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile) -> list[str]:
        argv = ["vllm", "serve", spec.model.name, "--port", str(L.ENGINE_PORT)]
        argv += ["--tensor-parallel-size", str(pool.tp)]
        if pool.pipeline_parallel_size > 1:
            argv += ["--pipeline-parallel-size", str(pool.pipeline_parallel_size)]
        if pool.data_parallel_size > 1:
            argv += ["--data-parallel-size", str(pool.data_parallel_size)]
        if pool.expert_parallel:
            argv += ["--enable-expert-parallel"]
            if profile.all2all == "flag" and role in ALL2ALL:
                argv += [ALL2ALL_FLAG, ALL2ALL[role]]
        if role == "worker":
            offload = kv_offload.checked(pool, role, profile)
            return [*argv, "--enable-chunked-prefill", *(kv_offload.vllm_flags(pool, offload) if offload else [])]
        return [*argv, "--kv-transfer-config", kv_transfer_config(spec, role, profile, pool)]

    def rank_flags(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, rank: Rank, profile: EngineProfile
    ) -> list[Word]:
        return rank_flags(pool.layout(spec.topology.hardware), rank)

    def env(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile
    ) -> list[tuple[str, str]]:
        if not pool.expert_parallel:
            return []
        out = list(EXPERT_PARALLEL_ENV)
        if profile.all2all == "env" and role in ALL2ALL:
            out.append((ALL2ALL_ENV, ALL2ALL[role]))
        return out

    def ports(self, role: str, rank: Rank | None) -> list[dict[str, Any]]:
        out = []
        if role != "worker":
            out.append({"name": L.KV_SIDE_PORT_NAME, "containerPort": L.NIXL_PORT, "protocol": "TCP"})
        if rank == "leader":  # where the group's other ranks join the leader
            out.append({"name": L.RANK_JOIN_PORT_NAME, "containerPort": self.join_port(), "protocol": "TCP"})
        return out

    def join_port(self) -> int:
        return L.DP_RPC_PORT  # --data-parallel-rpc-port / --master-port (rank_flags)

    def kv_events_config(self, base: dict[str, object]) -> dict[str, object]:
        return {"enable_kv_cache_events": True, **base}  # KVEventsConfig publishes nothing without it

    def own_image(self) -> bool:
        return False


def rank_flags(layout: ReplicaLayout, rank: Rank) -> list[Word]:
    """One rank of a multi-node replica (LeaderWorkerSet environment; see engine_ranks).

    Data/expert parallel: every pod runs `--data-parallel-size-local` ranks and meets the leader at
    `--data-parallel-address`/`--data-parallel-rpc-port`; the others are `--headless` from rank index x
    local ranks. Tensor/pipeline parallel: `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`.
    """
    out: list[Word]
    if layout.dp > 1:
        out = ["--data-parallel-size-local", str(layout.dp_local), "--data-parallel-address", Raw(LEADER_ADDRESS)]
        out += ["--data-parallel-rpc-port", str(L.DP_RPC_PORT)]
        if rank == "worker":
            start = Raw(f"$(( {WORKER_INDEX} * {layout.dp_local} ))")
            out += ["--headless", "--data-parallel-start-rank", start]
    else:
        out = ["--nnodes", str(layout.pods), "--node-rank", Raw(WORKER_INDEX), "--master-addr", Raw(LEADER_ADDRESS)]
        out += ["--master-port", str(L.DP_RPC_PORT)]
        if rank == "worker":
            out.append("--headless")
    return out


RENDERER: Final = VllmRenderer()
