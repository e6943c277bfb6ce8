"""A pool's kvOffload (a CPU tier for KV blocks) in each engine's own terms, and the host memory it takes.

`spec.<pool>.kvOffload.cpuMemory` is one replica's tier, all its ranks together. vLLM runs an engine per
data-parallel rank, its size summed over that engine's tensor-parallel ranks; SGLang sizes the host pool
of each rank in whole GB. The profile's `kv_offload` says which form a release takes (xpyd_api.engines).
"""

from __future__ import annotations

import math
from typing import Any, Final

from xpyd_api.engines import EngineProfile, EngineUnsupported, kv_offload_problem
from xpyd_api.models import DisaggregatedDeploymentSpec, KvOffloadSpec, PoolSpec
from xpyd_api.quantity import GB, GIB

SIZE_FLAG: Final = "--kv-offloading-size"
BACKEND_FLAG: Final = "--kv-offloading-backend"
HICACHE_FLAGS: Final = ("--enable-hierarchical-cache", "--hicache-size")
# vLLM's connectors for each backend when a P/D connector is already set (vllm/config/vllm.py writes these itself
# when only the flags are given, replacing any other connector; xpyd chains them with a MultiConnector instead).
OFFLOAD_CONNECTOR: Final = {"native": "OffloadingConnector", "lmcache": "LMCacheConnectorV1"}


def checked(pool: PoolSpec, role: str, profile: EngineProfile) -> KvOffloadSpec | None:
    """The pool's kvOffload when this release renders one; EngineUnsupported names what would do (the spec's
    validation refuses the same first, xpyd_api.models)."""
    offload = pool.kv_offload
    if offload is None:
        return None
    if (problem := kv_offload_problem(profile, f"spec.{role}.kvOffload", offload.backend, offload.disk)) is not None:
        raise EngineUnsupported(problem)
    return offload


def engine_bytes(pool: PoolSpec, offload: KvOffloadSpec) -> int:
    """Bytes of one vLLM engine (one data-parallel rank, its tensor-parallel ranks together)."""
    return offload.cpu_bytes // pool.data_parallel_size


def _gib(n: int) -> str:
    return format(round(n / GIB, 3), "g")


def vllm_flags(pool: PoolSpec, offload: KvOffloadSpec) -> list[str]:
    """An aggregated pool (no other connector): vLLM's own flags."""
    return [SIZE_FLAG, _gib(engine_bytes(pool, offload)), BACKEND_FLAG, offload.backend]


def vllm_connector(pool: PoolSpec, offload: KvOffloadSpec) -> dict[str, Any]:
    """The offloading connector's entry in a MultiConnector, as vllm/config/vllm.py would configure it."""
    per_engine = engine_bytes(pool, offload)
    if offload.backend == "lmcache":
        gb_per_rank = per_engine / GIB / (pool.tp * pool.pipeline_parallel_size)
        extra: dict[str, Any] = {"lmcache.local_cpu": True, "lmcache.max_local_cpu_size": round(gb_per_rank, 3)}
    else:
        extra = {"cpu_bytes_to_use": per_engine}
    return {
        "kv_connector": OFFLOAD_CONNECTOR[offload.backend],
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def multi_connector(handoff: dict[str, Any], offload: dict[str, Any]) -> dict[str, Any]:
    """The P/D connector first (a hit there is a transfer), the CPU tier second."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": handoff["kv_role"],
        "kv_connector_extra_config": {"connectors": [handoff, offload]},
    }


def sglang_flags(pool: PoolSpec, offload: KvOffloadSpec) -> list[str]:
    """HiCache: --hicache-size is each rank's host pool in whole GB (1e9 bytes), at least 1."""
    ranks = pool.tp * pool.data_parallel_size * pool.pipeline_parallel_size
    return [HICACHE_FLAGS[0], HICACHE_FLAGS[1], str(max(1, offload.cpu_bytes // ranks // GB))]


def pod_bytes(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile) -> int:
    """Host memory one pod's engine takes for the tier (its share of the replica's); 0 where none is rendered."""
    offload = pool.kv_offload
    if offload is None or profile.kv_offload == "none":
        return 0
    return math.ceil(offload.cpu_bytes / pool.layout(spec.topology.hardware).pods)
