"""The policy registry: names the simulator, the CLI and the CRD's router.policy field refer to."""

from __future__ import annotations

from collections.abc import Callable

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import Decision, NoWorker, Plan, Policy, RouterContext, RouteRequest, WorkerState
from xpyd_router.policy.base import kv_path, record
from xpyd_router.policy.kv import DEFAULT_SCORERS, BreakEvenDecider, KvAwareConfig, KvAwarePolicy, LoadBound
from xpyd_router.policy.parts import Disaggregate, Filter, PdDecider, Scorer, ScorerWeight
from xpyd_router.policy.scorers import SCORERS
from xpyd_router.policy.simple import LeastLoadedPolicy, RoundRobinPolicy

POLICIES: dict[str, Callable[[], Policy]] = {
    "kv-aware": KvAwarePolicy,
    "round-robin": RoundRobinPolicy,
    "least-loaded": LeastLoadedPolicy,
}  # the peers' rules for benchmarks are registered by bench/baselines


def make_policy(name: str) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory()


__all__ = [
    "DEFAULT_SCORERS",
    "POLICIES",
    "SCORERS",
    "BreakEvenDecider",
    "Decision",
    "Disaggregate",
    "Filter",
    "KvAwareConfig",
    "KvAwarePolicy",
    "LoadBound",
    "NoWorker",
    "PdDecider",
    "Plan",
    "Policy",
    "PrefixIndex",
    "RouteRequest",
    "RouterContext",
    "Scorer",
    "ScorerWeight",
    "WorkerState",
    "kv_path",
    "make_policy",
    "record",
]
