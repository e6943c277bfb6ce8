"""Plain data the autoscaling policies read and return, shared by the operator and the simulator.

Pure: no I/O library. The spec's tunables come from the API models (`Targets` extends the spec's
`AutoscalingTargets`; `Behavior` defaults as `AutoscalingSpec` does), so they exist in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, Protocol

from pydantic import Field

from xpyd_api.models import AutoscalingSpec, AutoscalingTargets, RatioBand, SloSpec

from .slomodel import ReplicaPerf

PREFILL = "prefill"
DECODE = "decode"
WORKER = "worker"  # the single pool of Colocated mode: both prefill and decode signals apply


class PrometheusError(Exception):
    """Prometheus could not answer; ``reason`` is the AutoscalerHealthy condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, kw_only=True)
class PoolMetrics:
    """One pool's load as Prometheus sees it: sums or means over the pool's fresh series.

    ``None`` means Prometheus had no fresh sample for it. ``sampled_at`` is the newest sample time
    (seconds, same clock as ``now``); ``reporting`` is how many pods had fresh samples.
    """

    waiting: float | None = None  # sum of vllm:num_requests_waiting
    running: float | None = None  # sum of vllm:num_requests_running
    kv_usage: float | None = None  # mean of vllm:kv_cache_usage_perc, 0..1
    ttft_p90: float | None = None  # seconds
    itl_p90: float | None = None  # seconds
    prompt_tokens_rate: float | None = None  # sum of irate(vllm:prompt_tokens_total), tokens/s
    reporting: int | None = None
    sampled_at: float | None = None
    # what the SLO policy reads beside the above (None: not scraped)
    generation_tokens_rate: float | None = None  # sum of irate(vllm:generation_tokens_total), tokens/s
    request_rate: float | None = None  # requests/s finishing prefill (irate of the TTFT histogram's count)
    prefix_hit_ratio: float | None = None  # prefix-cache hits / queries over the last minute, 0..1
    # prompt length (tokens) at the 50th, 90th and 99th percentile of the requests over the last minute
    # (histogram_quantile of vllm:request_prompt_tokens); None where the engine does not export it
    prompt_tokens_p50: float | None = None
    prompt_tokens_p90: float | None = None
    prompt_tokens_p99: float | None = None
    # requests the deployment's router replicas hold for a worker to start (xpyd_router_held_requests):
    # the demand that wakes a pool at zero, the same figure on every pool (None: not scraped)
    held: float | None = None


@dataclass(frozen=True, kw_only=True)
class PoolObservation(PoolMetrics):
    """What one pool looks like now: sizes from the API server, load from Prometheus."""

    replicas: int  # the size currently asked of the StatefulSet
    ready: int = 0
    unschedulable: int = 0  # pods Pending because no node has free GPUs

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.ready < 0 or self.unschedulable < 0:
            raise ValueError(f"pool sizes must not be negative: {self}")
        if self.kv_usage is not None and not 0.0 <= self.kv_usage <= 1.0 + 1e-9:
            raise ValueError(f"kv_usage must be within 0..1, got {self.kv_usage}")

    @classmethod
    def of(cls, metrics: PoolMetrics, replicas: int, ready: int = 0, unschedulable: int = 0) -> PoolObservation:
        """The observation of a pool of these sizes with these metrics."""
        values = {f.name: getattr(metrics, f.name) for f in fields(PoolMetrics)}
        return cls(replicas=replicas, ready=ready, unschedulable=unschedulable, **values)


@dataclass(frozen=True)
class PoolBounds:
    """One pool's limits, from ``spec.<pool>.autoscaling`` and ``gpusPerReplica`` (validated there)."""

    min_replicas: int
    max_replicas: int
    gpus_per_replica: int = 1

    def clamp(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


class Targets(AutoscalingTargets):
    """What one replica should carry: the spec's targets (same fields, same defaults) and the hold band."""

    tolerance: float = Field(default=0.1, ge=0)  # load within (1 + tolerance) x target does not scale up


_SPEC_DEFAULTS: Final = AutoscalingSpec()


@dataclass(frozen=True)
class Behavior:
    """How fast and how calmly sizes move (times in seconds); the spec's fields default as the spec does."""

    stabilization_seconds: float = float(_SPEC_DEFAULTS.stabilization_seconds)  # scale down to the window's max
    scale_up_max_step: int = 4  # at most max(this, current) replicas added per decision
    scale_down_max_fraction: float = 0.25  # at most max(1, floor(current x this)) removed per decision
    scale_down_cooldown_seconds: float = 30.0  # between two scale-downs of one pool
    stale_after_seconds: float = _SPEC_DEFAULTS.stale_after()  # samples older than this count as missing

    def __post_init__(self) -> None:
        if self.scale_up_max_step < 1 or not 0 < self.scale_down_max_fraction <= 1:
            raise ValueError("scale_up_max_step must be >= 1 and scale_down_max_fraction within (0, 1]")

    @classmethod
    def of(cls, spec: AutoscalingSpec) -> Behavior:
        """The behaviour a spec asks for (stabilization window, staleness), the rest at its defaults."""
        return cls(stabilization_seconds=float(spec.stabilization_seconds), stale_after_seconds=spec.stale_after())


@dataclass(frozen=True)
class PolicyInputs:
    """Everything a policy sees in one decision, apart from its own history and the clock."""

    pools: Mapping[str, PoolObservation]
    bounds: Mapping[str, PoolBounds]
    targets: Targets = field(default_factory=Targets)
    behavior: Behavior = field(default_factory=Behavior)
    ratio_band: RatioBand | None = None  # prefill:decode replicas
    free_gpus: int | None = None  # rack-scale systems: GPUs still free in the rack, a hard ceiling on growth
    slo: SloSpec | None = None  # spec.slo: the SLO policy's targets
    perf: Mapping[str, ReplicaPerf] = field(default_factory=dict)  # per pool: the performance model's replica

    def __post_init__(self) -> None:
        missing = set(self.pools) - set(self.bounds)
        if missing:
            raise ValueError(f"no bounds for pools {sorted(missing)}")


@dataclass(frozen=True)
class PoolState:
    """One pool's memory of past decisions; lives in status.autoscaler.history to survive restarts."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, raw recommendation) within the window
    fresh_since: float | None = None  # start of the current unbroken run of fresh data
    capacity: float | None = None  # prompt tokens/s one prefill replica was seen to sustain (learned)
    last_desired: int | None = None  # the size this autoscaler last asked for
    last_scale_time: float | None = None
    last_scale_down_time: float | None = None
    last_direction: int = 0  # +1 up, -1 down, 0 never moved
    last_direction_change_time: float | None = None
    # the SLO policy's learning: its model's correction, the replica's measured time to Ready, the
    # predicted attainment of its last decision, the demand seen lately (for ramps) and the queue at
    # the last decision (time, waiting requests: its growth is arriving demand the pool did not serve),
    # the sizes it asked for over its burst memory (longer than the window: bursts that recur), the
    # prompt-length p99 scraped over the last minute (time, tokens: a tail buys replicas once it persists)
    # and since when the pool has had nothing to do (a window of it ends a series of bursts)
    correction: float | None = None
    ready_seconds: float | None = None
    pending_since: float | None = None  # when the pool last asked for more replicas than were Ready
    predicted: float | None = None
    demand: tuple[tuple[float, float], ...] = ()
    queue: tuple[float, float] | None = None
    needs: tuple[tuple[float, int], ...] = ()
    tails: tuple[tuple[float, float], ...] = ()
    idle_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendations": [[t, r] for t, r in self.recommendations],
            "freshSince": self.fresh_since,
            "capacity": self.capacity,
            "lastDesired": self.last_desired,
            "lastScaleTime": self.last_scale_time,
            "lastScaleDownTime": self.last_scale_down_time,
            "lastDirection": self.last_direction,
            "lastDirectionChangeTime": self.last_direction_change_time,
            "correction": self.correction,
            "readySeconds": self.ready_seconds,
            "pendingSince": self.pending_since,
            "predicted": self.predicted,
            "demand": [[t, v] for t, v in self.demand],
            "queue": None if self.queue is None else list(self.queue),
            "needs": [[t, n] for t, n in self.needs],
            "tails": [[t, v] for t, v in self.tails],
            "idleSince": self.idle_since,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolState:
        """Read back what ``to_dict`` wrote; junk (a hand-edited status) reads as an empty history."""
        try:
            recs = tuple((float(t), int(r)) for t, r in data.get("recommendations") or ())
            return cls(
                recommendations=recs,
                fresh_since=_opt_float(data.get("freshSince")),
                capacity=_opt_float(data.get("capacity")),
                last_desired=_opt_int(data.get("lastDesired")),
                last_scale_time=_opt_float(data.get("lastScaleTime")),
                last_scale_down_time=_opt_float(data.get("lastScaleDownTime")),
                last_direction=int(data.get("lastDirection") or 0),
                last_direction_change_time=_opt_float(data.get("lastDirectionChangeTime")),
                correction=_opt_float(data.get("correction")),
                ready_seconds=_opt_float(data.get("readySeconds")),
                pending_since=_opt_float(data.get("pendingSince")),
                predicted=_opt_float(data.get("predicted")),
                demand=tuple((float(t), float(v)) for t, v in data.get("demand") or ()),
                queue=_opt_pair(data.get("queue")),
                needs=tuple((float(t), int(n)) for t, n in data.get("needs") or ()),
                tails=tuple((float(t), float(v)) for t, v in data.get("tails") or ()),
                idle_since=_opt_float(data.get("idleSince")),
            )
        except (TypeError, ValueError):
            return cls()

    def moved(self, now: float, before: int, after: int) -> PoolState:
        """The state after the pool was resized from ``before`` to ``after`` at ``now``."""
        if after == before:
            return self
        direction = 1 if after > before else -1
        changed = self.last_direction != 0 and direction != self.last_direction
        return replace(
            self,
            last_scale_time=now,
            last_scale_down_time=now if direction < 0 else self.last_scale_down_time,
            last_direction=direction,
            last_direction_change_time=now if changed else self.last_direction_change_time,
        )


PolicyState = Mapping[str, PoolState]


def state_to_dict(state: PolicyState) -> dict[str, Any]:
    return {pool: s.to_dict() for pool, s in sorted(state.items())}


def state_from_dict(data: Mapping[str, Any] | None) -> dict[str, PoolState]:
    if not isinstance(data, Mapping):
        return {}
    return {str(k): PoolState.from_dict(v) for k, v in data.items() if isinstance(v, Mapping)}


@dataclass(frozen=True)
class PoolDecision:
    desired: int
    reason: str  # one short code: scale-up, scale-down, hold, stabilizing, ...
    message: str  # the same for a human, with numbers


@dataclass(frozen=True)
class Decision:
    """A policy's answer: a size per pool, whether it could see, and its history to keep."""

    pools: Mapping[str, PoolDecision]
    healthy: bool
    health_reason: str  # CamelCase condition reason
    health_message: str
    state: Mapping[str, PoolState]


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        raise ValueError("NaN")
    return f


def _opt_pair(v: Any) -> tuple[float, float] | None:
    if v is None:
        return None
    t, value = v
    return float(t), float(value)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


class Policy(Protocol):
    """What every autoscaling policy offers: pure, with its history passed in and handed back."""

    name: str

    def decide(self, inputs: PolicyInputs, state: Mapping[str, PoolState], now: float) -> Decision: ...
