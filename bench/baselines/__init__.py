"""Benchmark-only baselines: the peers' routing and autoscaling rules that xpyd is compared with.

They are not part of the product. `register()` adds them beside the product's policies, by name,
so the simulator (`--compare`), the routing benchmarks and a router started through
`bench/baselines/router.py` can use them.
"""

from __future__ import annotations

from bench.baselines.autoscalers import KedaPolicy, PlannerPolicy, SaturationPolicy
from bench.baselines.routers import LlmDPolicy, SGLangCachePolicy

from xpyd_operator.autoscaling.policy import AUTOSCALERS
from xpyd_router.policy.registry import POLICIES

ROUTERS = {"llm-d": LlmDPolicy, "sglang": SGLangCachePolicy}
SCALERS = {"keda": KedaPolicy, "saturation": SaturationPolicy, "planner": PlannerPolicy}


def register() -> None:
    """Make the peers' policies selectable by name (idempotent)."""
    POLICIES.update(ROUTERS)
    AUTOSCALERS.update(SCALERS)


__all__ = [
    "ROUTERS", "SCALERS", "KedaPolicy", "LlmDPolicy", "PlannerPolicy", "SGLangCachePolicy", "SaturationPolicy",
    "register",
]  # fmt: skip
