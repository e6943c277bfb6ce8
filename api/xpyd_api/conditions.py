"""Condition types, reasons and the merge rule: lastTransitionTime moves only when the status flips."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import Final

from xpyd_api.models import Condition, ConditionStatus

READY: Final = "Ready"
PROGRESSING: Final = "Progressing"
TOPOLOGY_SATISFIED: Final = "TopologySatisfied"
DISAGGREGATION_WORTHWHILE: Final = "DisaggregationWorthwhile"
COMPUTE_DOMAIN: Final = "ComputeDomainReady"
AUTOSCALER_HEALTHY: Final = "AutoscalerHealthy"  # written by the autoscaler, never by the reconciler
KV_DATA_PATH_HEALTHY: Final = "KvDataPathHealthy"  # the autoscaler too: no pair cooling off in the routers

# Types the reconciler owns; the rest are kept as they are.
RECONCILER_TYPES: Final = (READY, PROGRESSING, TOPOLOGY_SATISFIED, DISAGGREGATION_WORTHWHILE, COMPUTE_DOMAIN)


def rfc3339(t: float) -> str:
    """A Kubernetes timestamp (seconds, UTC, Z) for a Unix time."""
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def now_rfc3339() -> str:
    return rfc3339(time.time())


def make(
    type_: str, status: bool | ConditionStatus, reason: str, message: str = "", generation: int | None = None
) -> Condition:
    """A condition with a placeholder transition time; merge() fills in the real one."""
    value: ConditionStatus = ("True" if status else "False") if isinstance(status, bool) else status
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time="",
        observed_generation=generation,
    )


def merge(old: Iterable[Condition], new: Iterable[Condition], now: str, owned: Iterable[str]) -> list[Condition]:
    """Conditions after writing `new`: keep the old transition time unless the status changed.

    Types in `owned` that are absent from `new` are dropped; other old types are kept untouched.
    """
    previous = {c.type: c for c in old}
    fresh = {c.type: c for c in new}
    owned_set = set(owned) | set(fresh)
    out: list[Condition] = []
    for type_, cond in fresh.items():
        before = previous.get(type_)
        stamp = before.last_transition_time if before and before.status == cond.status else now
        out.append(cond.model_copy(update={"last_transition_time": stamp}))
    out.extend(c for t, c in previous.items() if t not in owned_set)
    return out


def find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
