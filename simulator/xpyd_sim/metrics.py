"""Collects per-request latencies, token-weighted ITL, KV traffic and replica counts into the report."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpyd_sim.request import SimRequest


class Histogram:
    """Log-spaced histogram (about 0.5% resolution) for samples too many to keep, like per-token ITL."""

    __slots__ = ("_scale", "counts", "lo", "total")

    def __init__(self, lo: float = 1e-5, hi: float = 1e4, bins: int = 4000) -> None:
        self.lo = lo
        self._scale = bins / math.log(hi / lo)
        self.counts = [0] * (bins + 1)
        self.total = 0

    def add(self, value: float, count: int = 1) -> None:
        i = int(math.log(max(value, self.lo) / self.lo) * self._scale) if value > self.lo else 0
        self.counts[min(i, len(self.counts) - 1)] += count
        self.total += count

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        return self.quantile_since(q, None)

    def quantile_since(self, q: float, marks: list[int] | None) -> float | None:
        """The q-quantile of what was added since `marks` (a copy of `counts`), or of everything."""
        counts = self.counts if marks is None else [c - m for c, m in zip(self.counts, marks, strict=True)]
        total = sum(counts) if marks is not None else self.total
        if not total:
            return None
        target = q * total
        seen = 0
        for i, c in enumerate(counts):
            seen += c
            if seen >= target and c:
                return self.lo * math.exp((i + 0.5) / self._scale)
        return None


def bucket_quantile(q: float, values: Sequence[float], bounds: Sequence[float]) -> float | None:
    """Prometheus's histogram_quantile of `values` counted into buckets with upper bounds `bounds`: linear
    within the bucket the rank falls in (from 0 for the first), the highest bound past the last; None
    for no value."""
    if not values:
        return None
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    rank, seen = q * len(values), 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            lo = bounds[i - 1] if i else 0.0
            return lo + (bounds[i] - lo) * (rank - seen) / c
        seen += c
    return float(bounds[-1])


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives: a request meets them when its TTFT and mean ITL are both within bounds."""

    ttft_s: float = 2.0
    itl_s: float = 0.1
    quantile: float = 0.9


def _pct(values: np.ndarray[Any, np.dtype[np.float64]], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 6) if len(values) else None


@dataclass
class Collector:
    """Everything the report needs, accumulated cheaply while the simulation runs."""

    slo: Slo = field(default_factory=Slo)
    window_s: float = 60.0
    ttft: array[float] = field(default_factory=lambda: array("d"))
    tpot: array[float] = field(default_factory=lambda: array("d"))
    e2e: array[float] = field(default_factory=lambda: array("d"))
    done_at: array[float] = field(default_factory=lambda: array("d"))
    itl: Histogram = field(default_factory=Histogram)
    kv_bytes: dict[str, int] = field(default_factory=lambda: {"nvlink": 0, "rdma": 0})
    handoffs: dict[str, int] = field(default_factory=lambda: {"nvlink": 0, "rdma": 0})
    direct: int = 0
    output_tokens: int = 0
    met: int = 0
    timeline: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    scale_events: list[tuple[float, str, int, str]] = field(default_factory=list)

    def finish(self, req: SimRequest) -> None:
        ttft = req.first_token - req.arrival
        n = req.output_tokens
        tpot = (req.finished - req.first_token) / (n - 1) if n > 1 else 0.0
        self.ttft.append(ttft)
        self.tpot.append(tpot)
        self.e2e.append(req.finished - req.arrival)
        self.done_at.append(req.finished)
        self.output_tokens += n
        self.direct += req.direct
        if ttft <= self.slo.ttft_s and tpot <= self.slo.itl_s:
            self.met += 1

    def handoff(self, path: str, nbytes: int) -> None:
        self.kv_bytes[path] += nbytes
        self.handoffs[path] += 1

    def sample(self, now: float, prefill: int, decode: int, queued: int, running: int) -> None:
        self.timeline.append((now, prefill, decode, queued, running))

    def window_attainment(self) -> float | None:
        """Share of `window_s` windows whose TTFT p-quantile met the SLO (by completion time)."""
        if not len(self.done_at):
            return None
        t = np.frombuffer(self.done_at, dtype=np.float64)
        ttft = np.frombuffer(self.ttft, dtype=np.float64)
        tpot = np.frombuffer(self.tpot, dtype=np.float64)
        idx = (t // self.window_s).astype(np.int64)
        ok = total = 0
        q = self.slo.quantile * 100
        for w in np.unique(idx):
            sel = idx == w
            total += 1
            good = np.percentile(ttft[sel], q) <= self.slo.ttft_s and np.percentile(tpot[sel], q) <= self.slo.itl_s
            ok += bool(good)
        return round(ok / total, 4)

    def latency_report(self) -> dict[str, Any]:
        ttft = np.frombuffer(self.ttft, dtype=np.float64)
        tpot = np.frombuffer(self.tpot, dtype=np.float64)
        e2e = np.frombuffer(self.e2e, dtype=np.float64)
        out: dict[str, Any] = {}
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            for q in (50, 90, 99):
                out[f"{name}_p{q}_s"] = _pct(values, q)
        for q in (50, 90, 99):
            v = self.itl.quantile(q / 100)
            out[f"itl_p{q}_s"] = None if v is None else round(v, 6)
        n = len(ttft)
        out["slo_attainment"] = round(self.met / n, 4) if n else None
        sq = self.slo.quantile
        ttft_q, itl_q = _pct(ttft, sq * 100), self.itl.quantile(sq)
        out["slo_met"] = bool(
            ttft_q is not None and itl_q is not None and ttft_q <= self.slo.ttft_s and itl_q <= self.slo.itl_s
        )
        out["slo_window_attainment"] = self.window_attainment()
        out["slo"] = {"ttft_s": self.slo.ttft_s, "itl_s": self.slo.itl_s, "quantile": sq}
        return out
