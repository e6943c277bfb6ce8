"""Self-healing prefill/decode pairs: a pair whose KV handoffs keep failing (or are slow) cools off.

The workers themselves stay in rotation (their breakers are the pool's business, xpyd_router.pool):
only the pairing is out. `PairHealth` is the pure state machine (a clock is passed in); `Pairs` applies
it where a plan is executed (xpyd_router.hops), after the policy chose, so the policies need not know:
a plan whose pair is cooling off goes to another ready decode worker of the prefill's engine revision
whose pair is healthy (the least loaded), or, with none, straight to the planned decode worker (it
computes the prompt itself). One log line per trip and per recovery.

Trips: `failures` handoffs in a row failed, or `slow` in a row took longer than `slow_seconds` (the
break-even the operator passes as --handoff-slow-seconds, exported as a gauge for the alert that
compares each pair's p99 with it; 0, the router's default, is off; see docs/operate.md). The first
cool-off is `cool_off` seconds; a pair that fails again on its first handoff after one trips at
once for twice as long, up to `max_cool_off`; a successful handoff resets it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from xpyd_router.metrics import RouterMetrics
from xpyd_router.model import Decision, KvPath, Plan, WorkerState
from xpyd_router.pool import WorkerPool

log = logging.getLogger("xpyd_router")
Pair = tuple[str, str]  # (prefill worker, decode worker), as the pool names them


@dataclass(frozen=True)
class PairLimits:
    failures: int = 3  # handoffs failed in a row that trip a pair (0: never)
    slow_seconds: float = 0.0  # a handoff slower than this is slow (0: latency never trips a pair)
    slow: int = 3  # slow handoffs in a row that trip a pair
    cool_off: float = 10.0  # seconds out of pairing after a first trip
    max_cool_off: float = 300.0  # the longest cool-off, however often it trips


@dataclass
class _State:
    failures: int = 0  # handoffs failed in a row
    slow: int = 0  # slow handoffs in a row
    trips: int = 0  # trips since the last good handoff (the exponent of the cool-off)
    until: float = 0.0  # cooling off until then (monotonic); 0: in pairing
    probation: bool = False  # back from a cool-off, no good handoff since: one failure trips it again


@dataclass
class PairHealth:
    """Per pair: consecutive failures and slow handoffs, and the cool-off they earned."""

    limits: PairLimits = field(default_factory=PairLimits)
    clock: Callable[[], float] = time.monotonic
    # (event, pair, reason, seconds): "trip" (its reason and cool-off) or "recover"; for logs and metrics.
    on_change: Callable[[str, Pair, str, float], None] | None = None
    _pairs: dict[Pair, _State] = field(default_factory=dict)

    def cooling(self, prefill: str, decode: str) -> bool:
        """Whether the pair is out of pairing now (an expired cool-off ends here: a recovery)."""
        state = self._pairs.get((prefill, decode))
        if state is None or not state.until:
            return False
        if state.until > self.clock():
            return True
        state.until, state.probation = 0.0, True
        self._tell("recover", (prefill, decode), "", 0.0)
        return False

    def cooling_count(self) -> int:
        return sum(1 for pair in list(self._pairs) if self.cooling(*pair))

    def ok(self, prefill: str, decode: str, seconds: float | None = None) -> None:
        """A handoff that worked, with its latency when the router saw it (a streamed NIXL one)."""
        key = (prefill, decode)
        state = self._pairs.get(key)
        if state is not None:
            self.cooling(prefill, decode)  # a cool-off that ended since: on probation now
        limits = self.limits
        slow = seconds is not None and 0 < limits.slow_seconds < seconds
        if state is None:
            if not slow:
                return  # the usual case: a healthy pair costs no state
            state = self._pairs[key] = _State()
        state.failures = 0
        if slow:
            state.slow += 1
            if state.probation or state.slow >= max(limits.slow, 1):
                self._trip(key, state, "slow")
            return
        if seconds is not None:
            state.slow = 0
        state.trips, state.probation = 0, False
        if not state.until and not state.slow:
            del self._pairs[key]

    def failed(self, prefill: str, decode: str) -> None:
        self.cooling(prefill, decode)  # a cool-off that ended since: on probation now
        state = self._pairs.setdefault((prefill, decode), _State())
        state.failures += 1
        limits = self.limits
        if limits.failures > 0 and (state.probation or state.failures >= limits.failures):
            self._trip((prefill, decode), state, "failures")

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drops the pairs of workers that left (`keep(name)` false for either)."""
        for pair in [p for p in self._pairs if not (keep(p[0]) and keep(p[1]))]:
            del self._pairs[pair]

    def _trip(self, pair: Pair, state: _State, reason: str) -> None:
        if state.until:  # already cooling off (a leg that began before the trip): nothing more
            return
        limits = self.limits
        seconds = min(limits.cool_off * 2**state.trips, limits.max_cool_off)
        state.trips += 1
        state.failures = state.slow = 0
        state.probation = False
        state.until = self.clock() + seconds
        self._tell("trip", pair, reason, seconds)

    def _tell(self, event: str, pair: Pair, reason: str, seconds: float) -> None:
        if self.on_change is not None:
            self.on_change(event, pair, reason, seconds)


def _same_engine(a: WorkerState, b: WorkerState) -> bool:
    return not a.rev or not b.rev or a.rev == b.rev


def _kv_path(prefill: WorkerState, decode: WorkerState) -> KvPath:
    return "nvlink" if prefill.domain and prefill.domain == decode.domain else "rdma"


def reroute(
    plan: Plan,
    health: PairHealth,
    workers: dict[str, WorkerState],
    ready: list[WorkerState],
    failed: frozenset[Pair] = frozenset(),
) -> Plan:
    """The plan to run: `plan` when its pair is in pairing; else the same prefill with another of the
    `ready` decode workers (same engine revision, pair not cooling off and not among the pairs that
    `failed` this request already, least loaded, then by name); else one hop on the planned decode
    worker. The reason says which: `pair_cooling[_direct]`, or `pair_retry[_direct]` for a retry
    after this request's own handoff failed on a pair still in pairing."""
    first = plan.prefill

    def out(prefill: str, decode: str) -> bool:
        return (prefill, decode) in failed or health.cooling(prefill, decode)

    if first is None or not out(first.worker, plan.decode.worker):
        return plan
    why = "pair_cooling" if health.cooling(first.worker, plan.decode.worker) else "pair_retry"
    prefill = workers.get(first.worker)
    if prefill is not None:
        others = [
            w for w in ready
            if w.name != plan.decode.worker and _same_engine(prefill, w) and not out(first.worker, w.name)
        ]  # fmt: skip
        if others:
            best = min(others, key=lambda w: (w.load, w.name))
            return replace(plan, decode=Decision(best.name, why), kv_path=_kv_path(prefill, best))
    return Plan(decode=replace(plan.decode, reason=f"{why}_direct"))


_TOKENS = re.compile(rb"\s*(\d+)")


def prompt_tokens(data: bytes) -> int:
    """A reply's usage.prompt_tokens, read off its bytes (0 when absent): the prefill reply is small and
    already parsed once, for its KV params."""
    at = data.rfind(b'"prompt_tokens":')
    found = _TOKENS.match(data, at + 16) if at >= 0 else None
    return int(found.group(1)) if found else 0


class Pairs:
    """The pair health of one router, with its metrics and log lines (xpyd_router.hops calls it)."""

    def __init__(self, pool: WorkerPool, metrics: RouterMetrics, limits: PairLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.pool, self.metrics = pool, metrics
        self.health = PairHealth(limits or PairLimits(), clock, self._changed)
        metrics.pairs_cooling.labels(metrics.deployment).set_function(self.cooling_now)
        metrics.handoff_breakeven.labels(metrics.deployment).set(self.health.limits.slow_seconds)

    def plan(self, plan: Plan, failed: frozenset[Pair] = frozenset()) -> Plan:
        """The plan to run (`reroute`, around the pairs whose handoff `failed` this request already)."""
        if plan.prefill is None:
            return plan
        return reroute(plan, self.health, self.pool.workers, self.pool.ready("decode"), failed)

    def ok(self, prefill: str, decode: str, seconds: float | None) -> None:
        """A handoff that worked, with its latency where the router saw one."""
        self.health.ok(prefill, decode, seconds)

    def failed(self, prefill: str, decode: str, worker_down: bool) -> None:
        """A decode leg failed: only an answered failure counts against the pair (an unreachable worker is
        out of rotation already, xpyd_router.pool)."""
        if not worker_down:
            self.health.failed(prefill, decode)

    def cooling_now(self) -> float:
        """The gauge, at scrape time: pairs of workers that left are forgotten first."""
        workers = self.pool.workers
        self.health.forget(workers.__contains__)
        return self.health.cooling_count()

    def _changed(self, event: str, pair: Pair, reason: str, seconds: float) -> None:
        prefill, decode = pair
        if event == "trip":
            log.warning("KV pair %s -> %s out of pairing for %g s (%s)", prefill, decode, seconds, reason)
            self.metrics.pair_tripped(prefill, decode, reason)
        else:
            log.warning("KV pair %s -> %s back in pairing", prefill, decode)
