"""What all routing policies share: the two-step plan, the KV path and recording into the index."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.hashing import rendezvous
from xpyd_router.model import Decision, KvPath, NoWorker, Plan, RouteRequest, WorkerState
from xpyd_router.prefix_index import PrefixIndex


def kv_path(prefill: WorkerState, decode: WorkerState) -> KvPath:
    """NVLink when both workers share a known NVLink domain, else RDMA over the NICs."""
    return "nvlink" if prefill.domain and prefill.domain == decode.domain else "rdma"


def same_engine(a: WorkerState, b: WorkerState) -> bool:
    """Whether a KV handoff between the two is safe: equal engine revisions, or one is unknown (static URLs)."""
    return not a.rev or not b.rev or a.rev == b.rev


def pairable(prefill: Sequence[WorkerState], decode: Sequence[WorkerState]) -> list[WorkerState]:
    """Prefill workers with at least one decode worker of their engine revision (mid-upgrade, some have none)."""
    return [p for p in prefill if any(same_engine(p, d) for d in decode)]


def partners(decode: Sequence[WorkerState], prefill: WorkerState) -> list[WorkerState]:
    return [d for d in decode if same_engine(prefill, d)]


def find(workers: Sequence[WorkerState], name: str) -> WorkerState:
    for worker in workers:
        if worker.name == name:
            return worker
    raise KeyError(name)


def tie_break(key: int, names: list[str]) -> str:
    return names[0] if len(names) == 1 else rendezvous(key, names)


class BasePolicy:
    """Two hops (prefill, then decode) when a prefill pool exists, else one hop on the other pool."""

    name = "base"

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        raise NotImplementedError

    def choose_decode(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        prefill: WorkerState | None,
        index: PrefixIndex,
    ) -> Decision:
        raise NotImplementedError

    def plan(
        self,
        req: RouteRequest,
        prefill_workers: Sequence[WorkerState],
        decode_workers: Sequence[WorkerState],
        index: PrefixIndex,
    ) -> Plan:
        if not decode_workers:
            raise NoWorker("decode" if prefill_workers else "worker")
        prefill_workers = pairable(prefill_workers, decode_workers)
        if not prefill_workers:
            # Co-located pool (or no prefill worker with a decode of its engine): one hop, chosen like a prefill.
            return Plan(decode=self.choose_prefill(req, decode_workers, index))
        first = self.choose_prefill(req, prefill_workers, index)
        prefill = find(prefill_workers, first.worker)
        second = self.choose_decode(req, partners(decode_workers, prefill), prefill, index)
        return Plan(decode=second, prefill=first, kv_path=kv_path(prefill, find(decode_workers, second.worker)))


def recipients(plan: Plan) -> tuple[str, ...]:
    """The workers that end up holding the prompt: the prefill worker computed it, the decode worker received it."""
    return (plan.decode.worker,) if plan.prefill is None else (plan.prefill.worker, plan.decode.worker)


def record(index: PrefixIndex, plan: Plan, req: RouteRequest) -> None:
    """After routing: the prompt's blocks are cached on each of the plan's recipients."""
    if not req.blocks:
        return
    for worker in recipients(plan):
        index.record(worker, req.blocks)


def first_hop_blocks(plan: Plan, req: RouteRequest) -> int:
    """The uncached prompt blocks the first hop computes, whether a prefill or the only hop: the
    in-flight work the pool counts on that worker until the prompt is done (its first token)."""
    return len(req.blocks) - (plan.prefill or plan.decode).matched_blocks


def prefill_blocks(plan: Plan, req: RouteRequest) -> int:
    """The uncached prompt blocks the prefill hop computes: the in-flight work the pool counts on
    that worker for the hop (0 when the request goes straight to decode)."""
    return len(req.blocks) - plan.prefill.matched_blocks if plan.prefill is not None else 0
