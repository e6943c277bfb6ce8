"""What all routing policies share: the two-step plan, the KV path and recording into the index."""

from __future__ import annotations

from collections.abc import Sequence

from xpyd_router.hashing import rendezvous
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, KvPath, NoWorker, Plan, RouterContext, RouteRequest, Workers, WorkerState
from xpyd_router.policy.parts import Disaggregate, PdDecider, RouteView


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
    """Two hops (prefill, then decode) when a prefill pool exists, else one hop on the other pool.

    A policy implements `pick_prefill` (also the one hop of a co-located pool) and `pick_decode`, and
    may set `decider` (a `PdDecider`: whether a request skips prefill). The pool sets its context
    (`set_context`: the router replicas); `choose_prefill` / `choose_decode` ask one hop alone."""

    name = "base"
    decider: PdDecider = Disaggregate()
    context = RouterContext()

    def set_context(self, context: RouterContext) -> None:
        self.context = context

    def pick_prefill(self, view: RouteView, workers: Sequence[WorkerState]) -> Decision:
        raise NotImplementedError

    def pick_decode(self, view: RouteView, workers: Sequence[WorkerState], prefill: WorkerState | None) -> Decision:
        raise NotImplementedError

    def choose_prefill(self, req: RouteRequest, workers: Sequence[WorkerState], index: PrefixIndex) -> Decision:
        if not workers:
            raise NoWorker("prefill")
        return self.pick_prefill(RouteView(req, index, self.context), workers)

    def choose_decode(
        self,
        req: RouteRequest,
        workers: Sequence[WorkerState],
        prefill: WorkerState | None,
        index: PrefixIndex,
    ) -> Decision:
        if not workers:
            raise NoWorker("decode")
        return self.pick_decode(RouteView(req, index, self.context), workers, prefill)

    def plan(self, req: RouteRequest, prefill_workers: Workers, decode_workers: Workers, index: PrefixIndex) -> Plan:
        if not decode_workers:
            raise NoWorker("decode" if prefill_workers else "worker")
        view = RouteView(req, index, self.context)
        prefill_workers = pairable(prefill_workers, decode_workers)  # mid-upgrade: only same-engine pairs
        if not prefill_workers:
            # Co-located pool (or no prefill worker with a decode of its engine): one hop, chosen like a prefill.
            return Plan(decode=self.pick_prefill(view, decode_workers))
        direct = self.decider.direct(view, prefill_workers, decode_workers)
        if direct is not None:
            return Plan(decode=direct)
        first = self.pick_prefill(view, prefill_workers)
        prefill = find(prefill_workers, first.worker)
        second = self.pick_decode(view, partners(decode_workers, prefill), prefill)
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
    in-flight work the pool counts on that worker until the prompt is done (its first token); a
    priced reload counts as the recompute it does not save."""
    first = plan.prefill or plan.decode
    return max(0, len(req.blocks) - first.matched_blocks - first.saved_blocks)


def prefill_blocks(plan: Plan, req: RouteRequest) -> int:
    """The uncached prompt blocks the prefill hop computes: the in-flight work the pool counts on
    that worker for the hop (0 when the request goes straight to decode); a priced reload counts as
    the recompute it does not save."""
    first = plan.prefill
    return max(0, len(req.blocks) - first.matched_blocks - first.saved_blocks) if first is not None else 0
