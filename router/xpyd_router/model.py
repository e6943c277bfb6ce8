"""The data a routing policy sees and returns: worker state, requests, decisions and plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from xpyd_router.kv.prefix_index import PrefixIndex

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
    slow_scrapes: int = 0  # consecutive /metrics scrapes that timed out (a busy engine answers late)
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


Workers = Sequence[WorkerState]  # a hop's candidates, in the order the pool lists them


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
    matched_blocks: int = 0  # leading prompt blocks the worker holds on its GPU
    saved_blocks: int = 0  # blocks of recompute a priced reload from its CPU tier saves (RouteView.saved)


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


@dataclass(frozen=True)
class RouterContext:
    """What a policy is told from outside the request: the router replicas routing to the same workers.

    Discovery (or `--peers`) counts the replicas and the route exchange says whether every peer is
    passing on its routes (loadshare.py); the simulator says both as a cluster would. A policy whose
    choice depends on whether the replicas' indexes agree (the kv-aware one lets prefixes stick only
    then) reads it; the others ignore it."""

    replicas: int = 1  # router replicas routing to the same workers, this one included
    routes_shared: bool = False  # every peer passes this replica its routes (their guesses are in its index)


class Policy(Protocol):
    """What the pool asks of a routing policy: a plan per request, and the context it routes in."""

    name: str

    def set_context(self, context: RouterContext) -> None: ...

    def choose_prefill(self, req: RouteRequest, workers: Workers, index: PrefixIndex) -> Decision:
        """The first hop alone (a prefill, or the one hop of a co-located pool), as `plan` would choose it."""

    def plan(self, req: RouteRequest, prefill_workers: Workers, decode_workers: Workers, index: PrefixIndex) -> Plan:
        """Where the request goes, from the ready workers of each pool (no prefill worker: one hop)."""
