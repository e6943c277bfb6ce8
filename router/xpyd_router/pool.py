"""The live set of workers: membership, draining, in-flight accounting and the routing call."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from xpyd_router.model import NoWorker, Plan, Policy, Role, RouteRequest, WorkerState
from xpyd_router.policy_base import record
from xpyd_router.prefix_index import PrefixIndex
from xpyd_router.scrape import WorkerMetrics


@dataclass(frozen=True)
class WorkerSpec:
    """A worker to route to, as discovery found it."""

    url: str
    role: Role
    domain: str = ""


def parse_worker_arg(raw: str, role: Role) -> WorkerSpec:
    """`http://host:port[@domain]` -> WorkerSpec; the domain names the worker's NVLink domain."""
    url, _, domain = raw.partition("@")
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ValueError(f"worker URL must look like http://HOST:PORT[@domain], got {raw!r}")
    return WorkerSpec(url, role, domain)


class WorkerPool:
    """Workers by name; removed ones drain (no new requests) and disappear once idle."""

    def __init__(self, policy: Policy, block_chars: int, chars_per_token: float = 4.0) -> None:
        self.policy = policy
        self.index = PrefixIndex()
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.workers: dict[str, WorkerState] = {}

    def set_workers(self, specs: Iterable[WorkerSpec]) -> None:
        """Level-based update: add new workers, update domains, drain the ones no longer listed."""
        wanted = {spec.url: spec for spec in specs}
        for name, spec in wanted.items():
            current = self.workers.get(name)
            if current is None or current.role != spec.role:
                self.workers[name] = WorkerState(name=name, role=spec.role, domain=spec.domain)
            else:
                current.domain = spec.domain
                current.draining = False
        for name, worker in list(self.workers.items()):
            if name not in wanted:
                worker.draining = True
                self._drop_if_idle(worker)

    def _drop_if_idle(self, worker: WorkerState) -> None:
        if worker.draining and worker.inflight <= 0:
            self.workers.pop(worker.name, None)
            self.index.remove_worker(worker.name)

    def ready(self, role: Role) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.role == role and w.healthy and not w.draining]

    def has_prefill_pool(self) -> bool:
        return any(w.role == "prefill" for w in self.workers.values())

    def route(self, req: RouteRequest, exclude: frozenset[str] = frozenset()) -> Plan:
        """Asks the policy for a plan over the ready workers and records it in the prefix index."""
        decode_role: Role = "worker" if any(w.role == "worker" for w in self.workers.values()) else "decode"
        prefill = [w for w in self.ready("prefill") if w.name not in exclude]
        decode = [w for w in self.ready(decode_role) if w.name not in exclude]
        if not decode:
            raise NoWorker(decode_role)
        plan = self.policy.plan(req, prefill, decode, self.index)
        record(self.index, plan, req)
        return plan

    def begin(self, name: str, blocks: int = 0) -> None:
        worker = self.workers.get(name)
        if worker is not None:
            worker.inflight += 1
            worker.inflight_blocks += blocks

    def end(self, name: str, blocks: int = 0) -> None:
        worker = self.workers.get(name)
        if worker is not None:
            worker.inflight -= 1
            worker.inflight_blocks -= blocks
            self._drop_if_idle(worker)

    def mark_failed(self, name: str) -> None:
        """Takes a worker out of rotation until its /metrics answers again."""
        worker = self.workers.get(name)
        if worker is not None:
            worker.healthy = False

    def apply_metrics(self, name: str, metrics: WorkerMetrics | None) -> None:
        worker = self.workers.get(name)
        if worker is None:
            return
        if metrics is None:
            worker.healthy = False
            return
        worker.healthy = True
        worker.waiting, worker.running, worker.kv_usage = metrics.waiting, metrics.running, metrics.kv_usage
        if metrics.capacity_tokens > 0:
            blocks = int(metrics.capacity_tokens * self.chars_per_token) // self.block_chars
            worker.capacity_blocks = max(blocks, 1)
            self.index.set_capacity(name, worker.capacity_blocks)
