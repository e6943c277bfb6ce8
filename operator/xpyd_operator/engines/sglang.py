"""SGLang's command line, rank flags and ports, per release (the profile says what differs)."""

from __future__ import annotations

from typing import Any, Final

from xpyd_api import labels as L
from xpyd_api.engines import EngineProfile
from xpyd_api.layout import ReplicaLayout
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator.engine_ranks import LEADER_ADDRESS, WORKER_INDEX, Rank, Raw, Word
from xpyd_operator.engines import offload as kv_offload

# Wide expert parallel picks DeepEP's kernels by role: throughput for prefill, latency for decode.
DEEPEP_MODE: Final = {"prefill": "normal", "decode": "low_latency"}


class SglangRenderer:
    """SGLang's server (`python3 -m sglang.launch_server`)."""

    def argv(self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile) -> list[str]:
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", spec.model.name]
        argv += ["--host", "0.0.0.0", "--port", str(L.ENGINE_PORT)]
        # no /metrics without them: no autoscaling, drain count or dashboards (nor the SLO policy's prompt mix)
        argv += profile.metrics_flags
        argv += ["--tp-size", str(pool.tp * pool.data_parallel_size)]  # spans the data-parallel attention ranks
        if pool.pipeline_parallel_size > 1:
            argv += ["--pp-size", str(pool.pipeline_parallel_size)]
        if pool.data_parallel_size > 1:  # SGLang's --tp is the world size; data-parallel attention splits it
            dp = str(pool.data_parallel_size)
            if profile.dp_attention == "attn-dp-size":  # 0.5.23: instead of --dp-size N --enable-dp-attention
                argv += ["--attn-dp-size", dp]
            else:
                argv += ["--dp-size", dp, "--enable-dp-attention"]
        if pool.expert_parallel:
            argv += ["--ep-size", str(pool.tp * pool.data_parallel_size)]
        if (offload := kv_offload.checked(pool, role, profile)) is not None:
            argv += kv_offload.sglang_flags(pool, offload)
        if role == "worker":
            return [*argv, "--enable-mixed-chunk"]
        backend = "nixl" if spec.engine.kv_connector == "NixlConnector" else "mooncake"
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", backend]
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(L.SGLANG_BOOTSTRAP_PORT)]
        return argv

    def rank_flags(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, rank: Rank, profile: EngineProfile
    ) -> list[Word]:
        return rank_flags(pool.layout(spec.topology.hardware), role)

    def env(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile
    ) -> list[tuple[str, str]]:
        return []

    def ports(self, role: str, rank: Rank | None) -> list[dict[str, Any]]:
        out = []
        if role != "worker":
            out.append({"name": L.KV_SIDE_PORT_NAME, "containerPort": L.NIXL_PORT, "protocol": "TCP"})
        if role == "prefill":
            out.append({"name": L.BOOTSTRAP_PORT_NAME, "containerPort": L.SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"})
        if rank == "leader":
            out.append({"name": L.RANK_JOIN_PORT_NAME, "containerPort": self.join_port(), "protocol": "TCP"})
        return out

    def join_port(self) -> int:
        return L.SGLANG_DIST_PORT  # --dist-init-addr's port (rank_flags)

    def kv_events_config(self, base: dict[str, object]) -> dict[str, object]:
        return base  # its KVEventsConfig publishes when given; it has no enable key (and ignores unknown ones)

    def own_image(self) -> bool:
        return False


def rank_flags(layout: ReplicaLayout, role: str) -> list[Word]:
    """The node count, this node's rank and the leader's init address; DeepEP's mode by role."""
    out: list[Word] = ["--nnodes", str(layout.pods), "--node-rank", Raw(WORKER_INDEX)]
    out += ["--dist-init-addr", Raw(f"{LEADER_ADDRESS}:{L.SGLANG_DIST_PORT}")]
    if layout.expert_parallel and role in DEEPEP_MODE:
        out += ["--moe-a2a-backend", "deepep", "--deepep-mode", DEEPEP_MODE[role]]
    return out


RENDERER: Final = SglangRenderer()
