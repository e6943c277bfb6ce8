"""The data a routing policy sees and returns: worker state, requests, decisions and plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from xpyd_router.prefix_index import PrefixIndex

Role = Literal["prefill", "decode", "worker"]
KvPath = Literal["nvlink", "rdma", "none"]
WORKER_ROLES: tuple[Role, ...] = ("prefill", "decode", "worker")


@dataclass
class WorkerState:
    """One worker as the router knows it: scraped metrics plus the router's own in-flight counts."""

    name: str  # base URL, e.g. http://127.0.0.1:8101
    role: Role
    domain: str = ""  # NVLink domain: node name on HGX, clique on NVL72 ("" when unknown)
    rev: str = ""  # engine revision (pod label xpyd.io/engine-rev): KV moves only between equal ones
    waiting: float = 0.0  # vllm:num_requests_waiting
    running: float = 0.0  # vllm:num_requests_running
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0-1
    inflight: int = 0  # requests this router has on the worker now
    inflight_blocks: int = 0  # uncached prompt blocks of those, still to prefill
    peer_inflight: int = 0  # requests the other router replicas said they have on it (load sharing)
    peer_blocks: int = 0  # uncached prompt blocks of those, still to prefill
    capacity_blocks: int = 0  # prefix-index blocks the worker's KV cache holds (0: unknown)
    draining: bool = False  # leaving: finishes what it has, gets nothing new
    healthy: bool = True
    failures: int = 0  # consecutive requests that failed on this worker (the circuit breaker's count)
    held_until: float = 0.0  # monotonic time before which no probe may bring it back
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def load(self) -> float:
        """Requests queued or running: the larger of the scraped view and the router replicas' own counts."""
        return max(float(self.inflight + self.peer_inflight), self.waiting + self.running)

    @property
    def work(self) -> int:
        """Uncached prompt blocks the router replicas sent it that it is still computing."""
        return self.inflight_blocks + self.peer_blocks


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of a request: its chained prompt block hashes and a tie-break key."""

    blocks: Sequence[int]
    key: int
    prompt_chars: int = 0


@dataclass(frozen=True)
class Decision:
    worker: str
    reason: str
    matched_blocks: int = 0


@dataclass(frozen=True)
class Plan:
    """Where a request goes: prefill None means one hop to the decode (or co-located) worker."""

    decode: Decision
    prefill: Decision | None = None
    kv_path: KvPath = "none"


class NoWorker(Exception):
    """No ready worker of the needed role."""

    def __init__(self, role: str) -> None:
        super().__init__(f"no ready {'co-located' if role == 'worker' else role} worker")
        self.role = role


class Policy(Protocol):
    name: str

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision: ...

    def choose_decode(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        prefill: WorkerState | None,
        index: PrefixIndex,
    ) -> Decision: ...

    def plan(
        self,
        req: RouteRequest,
        prefill_workers: Sequence[WorkerState],
        decode_workers: Sequence[WorkerState],
        index: PrefixIndex,
    ) -> Plan: ...
