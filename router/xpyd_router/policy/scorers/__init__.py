"""The scorers a kv-aware policy ranks a hop's candidates by, by name (docs/extend.md, "Add a scorer").

`KvAwareConfig.scorers` (the router's `--scorers`) lists the names to use, in order, each with its
weight; a new scorer is a module here and one line in `SCORERS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xpyd_router.policy.parts import Scorer, ScorerWeight
from xpyd_router.policy.scorers.prefix import PrefixScorer
from xpyd_router.policy.scorers.recent import RecentScorer
from xpyd_router.policy.scorers.rendezvous import RendezvousScorer
from xpyd_router.policy.scorers.tiers import TierScorer

SCORERS: dict[str, Callable[[], Scorer]] = {
    "prefix": PrefixScorer,
    "recent": RecentScorer,
    "rendezvous": RendezvousScorer,
    "tiers": TierScorer,
}


def make_scorers(weights: Sequence[ScorerWeight]) -> list[tuple[Scorer, float]]:
    """The configured scorers, built from the registry, each with its weight."""
    out = []
    for spec in weights:
        try:
            factory = SCORERS[spec.name]
        except KeyError:
            raise ValueError(f"unknown scorer {spec.name!r}; choose from {', '.join(SCORERS)}") from None
        out.append((factory(), spec.weight))
    return out


def parse_weights(raw: str) -> tuple[ScorerWeight, ...]:
    """`NAME[=WEIGHT],...` (the router's `--scorers`) -> the configured scorers, in order; ValueError
    names what is wrong (an unknown scorer, a weight that is not a finite number, a repeat)."""
    out: list[ScorerWeight] = []
    for item in raw.split(","):
        name, eq, value = item.strip().partition("=")
        if not name:
            raise ValueError(f"empty scorer name in {raw!r}")
        if name not in SCORERS:
            raise ValueError(f"unknown scorer {name!r}; choose from {', '.join(SCORERS)}")
        if any(s.name == name for s in out):
            raise ValueError(f"scorer {name!r} given twice")
        try:
            weight = float(value) if eq else 1.0
        except ValueError:
            raise ValueError(f"weight of scorer {name!r} must be a number, got {value!r}") from None
        if not math.isfinite(weight):
            raise ValueError(f"weight of scorer {name!r} must be finite, got {value!r}")
        out.append(ScorerWeight(name, weight))
    return tuple(out)


def format_weights(weights: Sequence[ScorerWeight]) -> str:
    """The `--scorers` spelling of configured scorers (a weight of 1 left out)."""
    return ",".join(s.name if s.weight == 1 else f"{s.name}={s.weight:g}" for s in weights)
