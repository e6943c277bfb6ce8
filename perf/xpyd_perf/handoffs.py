"""`xpyd plan --measured`: the routers' measured KV handoffs per prefill/decode pair beside the predicted transfer.

The routers export, per pair, `xpyd_router_handoff_latency_seconds` (a histogram: prefill end to decode
first byte) and `xpyd_router_handoff_bytes_total` (prompt tokens x --kv-bytes-per-token). Read from a
router's /metrics text or from Prometheus' query API (both parsed here, pure; the caller fetches), each
pair's mean bytes per handoff is priced with the plan's transfer model (xpyd_perf.timing) and set beside
the measured mean and p99. The measured figure also holds the decode worker's first step and queue, so the
ratio is above 1 even for a transfer as fast as predicted: a pair far above the others is the one to look at.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from xpyd_perf.models import ModelSpec
from xpyd_perf.timing import handoff_lanes, handoff_seconds
from xpyd_perf.topology import resolve_topology

LATENCY: Final = "xpyd_router_handoff_latency_seconds"  # xpyd_api.metric_names.ROUTER_HANDOFF_LATENCY
BYTES: Final = "xpyd_router_handoff_bytes_total"  # ...ROUTER_HANDOFF_BYTES (xpyd_perf imports no package above it)
Pair = tuple[str, str, str]  # (deployment, prefill, decode)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True, slots=True)
class PairSample:
    """One pair's handoffs as the routers counted them (summed over router replicas)."""

    deployment: str
    prefill: str
    decode: str
    count: float
    seconds: float  # sum of the handoff latencies
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last
    kv_bytes: float | None  # None: the routers run without --kv-bytes-per-token

    def quantile(self, q: float) -> float | None:
        """The q-quantile, interpolated in its bucket as Prometheus' histogram_quantile does."""
        if self.count <= 0 or not self.buckets:
            return None
        rank, lower, below = q * self.buckets[-1][1], 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower  # in the open bucket: its lower bound, as Prometheus answers
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = upper, cumulative
        return lower


@dataclass(frozen=True, slots=True)
class PairComparison:
    sample: PairSample
    kv_bytes_mean: float | None
    prompt_tokens: int | None  # the prompt length that KV size stands for (the plan's KV bytes per token)
    predicted_seconds: float | None
    measured_mean_seconds: float
    measured_p99_seconds: float | None

    @property
    def ratio(self) -> float | None:
        """Measured mean over predicted transfer."""
        if self.predicted_seconds is None or self.predicted_seconds <= 0:
            return None
        return self.measured_mean_seconds / self.predicted_seconds

    def as_dict(self) -> dict[str, object]:
        s = self.sample
        return {
            "deployment": s.deployment, "prefill": s.prefill, "decode": s.decode, "handoffs": s.count,
            "kv_bytes_mean": self.kv_bytes_mean, "prompt_tokens": self.prompt_tokens,
            "predicted_seconds": self.predicted_seconds, "measured_mean_seconds": self.measured_mean_seconds,
            "measured_p99_seconds": self.measured_p99_seconds, "measured_over_predicted": self.ratio,
        }  # fmt: skip


def _labels(text: str, line: str) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise ValueError(f"unreadable labels in {line[:120]!r}")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def _number(value: str, line: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"not a number in {line[:120]!r}") from None


def parse_exposition(text: str) -> list[PairSample]:
    """The pairs in a router's /metrics text (Prometheus' text format); ValueError for a garbled line."""
    rows: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith((LATENCY, BYTES)):
            continue  # comments and every other family
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"unreadable sample {line[:120]!r}")
        rows.append((m.group(1), _labels(m.group(2) or "", line), _number(m.group(3), line)))
    return _samples(rows)


def parse_query(results: Mapping[str, str]) -> list[PairSample]:
    """The pairs in Prometheus' answers to `queries(...)` (query name -> the /api/v1/query response body)."""
    rows: list[tuple[str, dict[str, str], float]] = []
    for name, body in results.items():
        try:
            doc = json.loads(body)
            if doc.get("status") != "success":
                raise ValueError(f"Prometheus answered {doc.get('errorType')}: {doc.get('error')}")
            series = doc["data"]["result"]
            for s in series:
                labels = {str(k): str(v) for k, v in s["metric"].items()}
                if "namespace" in labels:
                    labels["deployment"] = f"{labels['namespace']}/{labels.get('deployment', '')}"
                rows.append((name, labels, float(s["value"][1])))
        except (KeyError, TypeError, IndexError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a Prometheus query answer for {name}: {exc}") from None
    return _samples(rows)


def queries(window: str) -> dict[str, str]:
    """The PromQL `parse_query` reads: each family's increase over `window`, summed over router replicas."""
    by = "namespace, deployment, prefill, decode"
    return {
        f"{LATENCY}_bucket": f"sum by ({by}, le) (increase({LATENCY}_bucket[{window}]))",
        f"{LATENCY}_sum": f"sum by ({by}) (increase({LATENCY}_sum[{window}]))",
        f"{LATENCY}_count": f"sum by ({by}) (increase({LATENCY}_count[{window}]))",
        BYTES: f"sum by ({by}) (increase({BYTES}[{window}]))",
    }


def _samples(rows: Iterable[tuple[str, Mapping[str, str], float]]) -> list[PairSample]:
    count: dict[Pair, float] = {}
    seconds: dict[Pair, float] = {}
    kv: dict[Pair, float] = {}
    buckets: dict[Pair, dict[float, float]] = {}
    for name, labels, value in rows:
        pair = (labels.get("deployment", ""), labels.get("prefill", ""), labels.get("decode", ""))
        if name == f"{LATENCY}_count":
            count[pair] = count.get(pair, 0.0) + value
        elif name == f"{LATENCY}_sum":
            seconds[pair] = seconds.get(pair, 0.0) + value
        elif name == f"{LATENCY}_bucket":
            le = _number(labels.get("le", "nan"), f"{name} le={labels.get('le')!r}")
            by_le = buckets.setdefault(pair, {})
            by_le[le] = by_le.get(le, 0.0) + value
        elif name == BYTES:
            kv[pair] = kv.get(pair, 0.0) + value
    return [
        PairSample(*pair, n, seconds.get(pair, 0.0), tuple(sorted(buckets.get(pair, {}).items())), kv.get(pair))
        for pair, n in sorted(count.items())
        if n > 0
    ]


def compare(
    samples: Sequence[PairSample],
    model: ModelSpec,
    topology: str,
    gpus_per_replica: int,
    kv_bytes_per_token: int | None = None,
    dp_attention: bool = False,
) -> list[PairComparison]:
    """Each pair's measured handoffs beside the transfer the plan predicts for its mean KV size."""
    topo = resolve_topology(topology)
    lanes = handoff_lanes(model, gpus_per_replica, gpus_per_replica, dp_attention)
    per_token = kv_bytes_per_token if kv_bytes_per_token is not None else model.kv_bytes_per_token
    out = []
    for s in samples:
        mean_bytes = s.kv_bytes / s.count if s.kv_bytes is not None else None
        predicted = handoff_seconds(round(mean_bytes), topo.cross_pool_path, topo.gpu, lanes) if mean_bytes else None
        tokens = round(mean_bytes / per_token) if mean_bytes and per_token > 0 else None
        out.append(PairComparison(s, mean_bytes, tokens, predicted, s.seconds / s.count, s.quantile(0.99)))
    return out


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.1f}" if seconds is not None else "-"


def table(rows: Sequence[PairComparison]) -> str:
    """Predicted against measured, one line per pair."""
    cols = ("prefill", "decode", "handoffs", "prompt", "KV GB", "predicted ms", "mean ms", "p99 ms", "ratio")
    cells = [list(cols)]
    for r in rows:
        s = r.sample
        pair = (f"{s.deployment}: {s.prefill}" if s.deployment else s.prefill, s.decode)
        size = (str(r.prompt_tokens) if r.prompt_tokens is not None else "-",
                f"{r.kv_bytes_mean / 1e9:.2f}" if r.kv_bytes_mean is not None else "-")  # fmt: skip
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        times = (_ms(r.predicted_seconds), _ms(r.measured_mean_seconds), _ms(r.measured_p99_seconds))
        cells.append([*pair, f"{s.count:.0f}", *size, *times, ratio])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def describe(rows: Sequence[PairComparison], topology: str, source: str) -> str:
    """The table with what it compares; one line when no pair has handed off."""
    if not rows:
        return f"measured ({source}): no KV handoff counted per prefill/decode pair yet"
    head = (f"measured KV handoffs ({source}; prefill end to decode first byte, so the decode's first step is in it) "
            f"vs the predicted transfer of each pair's mean KV size on {topology}:")  # fmt: skip
    out = [head, table(rows)]
    if any(r.kv_bytes_mean is None for r in rows):
        out.append("a pair without KV bytes: the router runs without --kv-bytes-per-token, nothing to predict from")
    return "\n".join(out)
