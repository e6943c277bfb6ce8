"""The live set of workers: membership, draining, in-flight accounting and the routing call."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from xpyd_router.kv.block_keys import RequestKeys
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import NoWorker, Plan, Policy, Role, RouteRequest, WorkerState
from xpyd_router.policy.base import recipients, record
from xpyd_router.scrape import WorkerMetrics
from xpyd_router.targets import rank_endpoint, replica_endpoints, split_target, target_name

SLOW_SCRAPES = 3  # consecutive timed-out scrapes that take a worker out (a refused one does at once)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker to route to, as discovery found it."""

    url: str  # the target (xpyd_router.targets): the API server's base URL, `#dpR` for one of its ranks
    role: Role
    domain: str = ""
    rev: str = ""  # engine revision; "" (static URLs) pairs with any
    kv_events: str = ""  # tcp://HOST:PORT of the engine's KV event publisher ("" : it publishes none), or
    # every rank's, space-separated (xpyd_router.targets.replica_endpoints)
    kv_replay: str = ""  # tcp://HOST:PORT of its replay socket ("" : none), or every rank's

    def extra(self) -> dict[str, str]:
        return {k: v for k, v in (("kv_events", self.kv_events), ("kv_replay", self.kv_replay)) if v}


def rank_targets(spec: WorkerSpec, size: int, local: int = 0, pods: Sequence[tuple[str, str]] = ()) -> list[WorkerSpec]:
    """The routing targets of a worker that fronts `size` data-parallel ranks (xpyd_router.targets):
    one per rank, its events on the rank's port; rank r runs on pod r // `local` of the replica's
    `pods` ((IP, NVLink domain) in worker-index order; none given: all on the worker's own host).
    A worker of one rank is its own target."""
    if size <= 1:
        return [spec]
    out = []
    for rank in range(size):
        host, domain = pods[rank // local] if pods and local > 0 and rank // local < len(pods) else ("", spec.domain)
        out.append(replace(
            spec, url=target_name(spec.url, rank), domain=domain or spec.domain,
            kv_events=rank_endpoint(spec.kv_events, rank, host), kv_replay=rank_endpoint(spec.kv_replay, rank, host),
        ))  # fmt: skip
    return out


def replica_target(spec: WorkerSpec, size: int, local: int = 0, pods: Sequence[tuple[str, str]] = ()) -> WorkerSpec:
    """A `size`-rank replica whose engine picks each request's rank: one target, subscribed to every
    rank's KV events (rank r on pod r // `local` of `pods`, as `rank_targets`)."""
    hosts = [ip for ip, _ in pods]
    return replace(
        spec, kv_events=replica_endpoints(spec.kv_events, size, local, hosts),
        kv_replay=replica_endpoints(spec.kv_replay, size, local, hosts),
    )  # fmt: skip


def parse_worker_arg(raw: str, role: Role) -> WorkerSpec:
    """`http://host:port[@domain]` -> WorkerSpec; the domain names the worker's NVLink domain."""
    url, _, domain = raw.partition("@")
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
        parts = urlsplit("")
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path or parts.query or parts.fragment:
        raise ValueError(f"worker URL must look like http://HOST:PORT[@domain] (plain HTTP, a port), got {raw!r}")
    return WorkerSpec(url, role, domain)


class WorkerPool:
    """Workers by name; removed ones drain (no new requests) and disappear once idle."""

    def __init__(
        self, policy: Policy, block_chars: int, chars_per_token: float = 4.0, keys: RequestKeys | None = None
    ) -> None:
        self.policy = policy
        self.index = PrefixIndex()
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.keys = keys or RequestKeys(None, 16, block_chars, chars_per_token)  # how prompts become block keys
        self.workers: dict[str, WorkerState] = {}
        # Set by the service: new workers then wait for a health probe before they get traffic.
        self.on_added: Callable[[str], None] | None = None
        self.breaker_failures = 5  # consecutive failed requests that take a worker out of rotation
        self.breaker_hold = 10.0  # seconds it then stays out, whatever its probes say
        self.clock: Callable[[], float] = time.monotonic
        # Set while router replicas share their routes (loadshare.py): the workers a plan sent a
        # prompt to and its blocks, which the other replicas record as the same guess this index did.
        self.on_route: Callable[[tuple[str, ...], Sequence[int]], None] | None = None
        # Set while pairs are warmed (warmup.py): a worker that was not healthy and now is.
        self.on_ready: Callable[[str], None] | None = None

    def set_workers(self, specs: Iterable[WorkerSpec]) -> None:
        """Level-based update: add new workers, update domains, drain the ones no longer listed."""
        wanted = {spec.url: spec for spec in specs}
        for name, spec in wanted.items():
            current = self.workers.get(name)
            if current is None or current.role != spec.role:
                probe = self.on_added
                state = WorkerState(name=name, role=spec.role, domain=spec.domain, rev=spec.rev, healthy=probe is None,
                                    extra=spec.extra())  # fmt: skip
                self.workers[name] = state
                if probe is not None:
                    probe(name)
            else:
                current.domain, current.rev, current.extra = spec.domain, spec.rev, spec.extra()
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

    def _has_other_ready(self, worker: WorkerState) -> bool:
        return any(w is not worker for w in self.ready(worker.role))

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
        if self.on_route is not None and req.blocks:
            self.on_route(recipients(plan), req.blocks)
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

    def prefilled(self, name: str, blocks: int) -> None:
        """The worker computed a one-hop request's prompt (its first token came): that work is done."""
        worker = self.workers.get(name)
        if worker is not None:
            worker.inflight_blocks -= blocks

    def mark_down(self, name: str, hold: float = 0.0) -> None:
        """A worker-level failure (refused, reset, timed out, failed probe): out of rotation until a
        probe succeeds, and not before `hold` seconds."""
        worker = self.workers.get(name)
        if worker is not None:
            worker.healthy = False
            worker.failures = 0
            if hold > 0:
                worker.held_until = max(worker.held_until, self.clock() + hold)

    def request_failed(self, name: str) -> bool:
        """One request failed on the worker (5xx, garbage): counted, not acted on, until
        `breaker_failures` in a row; True when that trips the breaker."""
        worker = self.workers.get(name)
        if worker is None:
            return False
        worker.failures += 1
        if worker.failures < self.breaker_failures:
            return False
        self.mark_down(name, self.breaker_hold)
        return True

    def request_ok(self, name: str) -> None:
        worker = self.workers.get(name)
        if worker is not None and worker.failures:
            worker.failures = 0

    def held(self, name: str) -> bool:
        worker = self.workers.get(name)
        return worker is not None and worker.held_until > self.clock()

    def apply_metrics(self, name: str, metrics: WorkerMetrics | None, timed_out: bool = False) -> None:
        """A scrape's outcome: None (it failed) takes the worker out, a timeout only the SLOW_SCRAPES-th in a
        row (an engine busy computing answers /metrics late, and one slow scrape of the only decode worker
        would fail every request meanwhile), and never the last ready worker of its role: slow scrapes say
        the engine is busy, not gone, and a hung one is taken out by its requests (timeouts, the breaker).
        An answer brings it back unless held."""
        worker = self.workers.get(name)
        if worker is None:
            return
        if metrics is None:
            worker.slow_scrapes = worker.slow_scrapes + 1 if timed_out else SLOW_SCRAPES
            if worker.slow_scrapes >= SLOW_SCRAPES and (not timed_out or self._has_other_ready(worker)):
                worker.healthy = False
            return
        worker.slow_scrapes = 0
        if not worker.healthy and worker.held_until > self.clock():
            return
        came_up, worker.healthy = not worker.healthy, True
        metrics = metrics.of_rank(split_target(name)[1])
        worker.waiting, worker.running, worker.kv_usage = metrics.waiting, metrics.running, metrics.kv_usage
        if metrics.capacity_tokens > 0:
            blocks = int(metrics.capacity_tokens / self.keys.tokens_per_block)
            worker.capacity_blocks = max(blocks, 1)
            self.index.set_capacity(name, worker.capacity_blocks)
        if came_up and self.on_ready is not None:
            self.on_ready(name)
