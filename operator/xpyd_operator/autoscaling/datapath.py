"""The KvDataPathHealthy condition, so that the routers' self-healing (pairs out of pairing) shows in status.

The routers (xpyd_router.pairs) take a prefill/decode pair whose KV handoffs keep failing, or keep
exceeding the break-even, out of pairing for a cool-off, and export how many they hold out
(``xpyd_router_pairs_cooling_off``) and each trip (``xpyd_router_pair_trips_total{prefill,decode,reason}``).
The autoscaler loop reads both each period (PrometheusClient.pairs, over ``queries``) and writes
``condition``'s answer beside AutoscalerHealthy; both are pure here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from xpyd_api import conditions as C
from xpyd_api import metric_names as names
from xpyd_api.models import Condition, ConditionStatus

from .promql import router_selector
from .types import PrometheusError

WINDOW: Final = "10m"  # twice the longest cool-off (5 min): a pair still out of pairing tripped within it
SHOWN: Final = 4  # pairs the message names; the others are counted


@dataclass(frozen=True)
class Trip:
    prefill: str  # the workers' target names, as the router labels them
    decode: str
    reason: str  # failures or slow


@dataclass(frozen=True)
class PairsHealth:
    """What Prometheus says of the deployment's routers' pairs."""

    cooling: float | None  # pairs held out of pairing now, summed over router replicas; None: no router series
    trips: tuple[Trip, ...] = ()  # the pairs (and why) that tripped within the window


def queries(namespace: str, deployment: str, window: str = WINDOW) -> tuple[str, str]:
    """(pairs cooling off now, the pairs that tripped within ``window`` by reason), over the deployment's routers."""
    sel = router_selector(namespace, deployment)
    trips, by = f"{names.ROUTER_PAIR_TRIPS}{{{sel}}}", "by (prefill, decode, reason)"
    return (
        f"sum({names.ROUTER_PAIRS_COOLING}{{{sel}}})",
        # a pair's first trip creates its series at 1, which increase() cannot see: a series new in the window is one
        f"sum {by} (increase({trips}[{window}])) > 0 or sum {by} ({trips} unless {trips} offset {window})",
    )


def pairs_health(cooling: Iterable[float], trips: Iterable[Mapping[str, str]]) -> PairsHealth:
    """The answers to ``queries`` (the sum's values, the trips' label sets) as one PairsHealth."""
    values = [v for v in cooling if math.isfinite(v)]
    seen = {Trip(t.get("prefill", "?"), t.get("decode", "?"), t.get("reason", "?")) for t in trips}
    return PairsHealth(sum(values) if values else None, tuple(sorted(seen, key=lambda t: (t.prefill, t.decode))))


def condition(
    answer: PairsHealth | PrometheusError,
    old: Iterable[Condition],
    now: float,
    generation: int | None,
    window: str = WINDOW,
) -> Condition:
    """KvDataPathHealthy: True while no router holds a pair out, False naming the pairs and why, Unknown when
    Prometheus cannot tell; its transition time kept while its status holds."""
    status: ConditionStatus
    if isinstance(answer, PrometheusError):
        status, reason = "Unknown", "PrometheusUnavailable"
        message = f"{answer.reason}: {answer.message}"
    elif answer.cooling is None:
        status, reason = "Unknown", "RouterMetricsMissing"
        message = f"Prometheus has no {names.ROUTER_PAIRS_COOLING} for this deployment: is its router scraped?"
    elif answer.cooling > 0:
        status, reason = "False", "PairsCoolingOff"
        message = (
            f"the routers hold {answer.cooling:g} prefill/decode pairs out of pairing (summed over router replicas); "
            f"tripped in the last {window}: {_named(answer.trips)}; their requests go to other pairs or decode alone"
        )
    else:
        status, reason = "True", "PairsInRotation"
        message = "every prefill/decode pair is in pairing"
        if answer.trips:
            message += f"; back after tripping in the last {window}: {_named(answer.trips)}"
    fresh = C.make(C.KV_DATA_PATH_HEALTHY, status, reason, message[:1000], generation)
    return C.merge(old, [fresh], C.rfc3339(now), ())[0]


def _named(trips: tuple[Trip, ...]) -> str:
    if not trips:
        return "none seen (an older trip)"
    shown = ", ".join(f"{t.prefill} -> {t.decode} ({t.reason})" for t in trips[:SHOWN])
    return shown + (f" and {len(trips) - SHOWN} more" if len(trips) > SHOWN else "")
