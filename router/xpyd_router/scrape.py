"""Reads the few engine /metrics series the router routes on, without a full Prometheus parser."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from xpyd_api.engines import METRICS
from xpyd_api.metric_names import CACHE_CONFIG as CACHE_CONFIG  # vLLM's; labels block_size, num_gpu_blocks

# The gauges it routes on, by their vLLM names, and every engine's names for them (xpyd_api.engines:
# one scraper serves every kind; vLLM's older KV-usage name is in its list).
WAITING, RUNNING, KV_USAGE = METRICS["vllm"].waiting, METRICS["vllm"].running, METRICS["vllm"].kv_usage[0]
ALIASES: dict[str, str] = {
    name: key
    for m in METRICS.values()
    for name, key in ((m.waiting, WAITING), (m.running, RUNNING), *((u, KV_USAGE) for u in m.kv_usage))
}
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class WorkerMetrics:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    block_size: int = 0  # tokens per KV block (0: not reported)
    num_gpu_blocks: int = 0
    engines: dict[str, WorkerMetrics] = field(default_factory=dict)  # by `engine` label, when several

    @property
    def capacity_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks

    def of_rank(self, rank: int | None) -> WorkerMetrics:
        """One data-parallel rank's figures (vLLM labels each engine `engine="<rank>"`); the whole
        replica's when the rank is None or the engine reported no such label."""
        return self if rank is None else self.engines.get(str(rank), self)


def parse_metrics(text: str) -> WorkerMetrics:
    """Sums each gauge over its label sets (one per model or engine) and reads the cache config.

    A data-parallel replica (one API server over several engines, on one pod or a LeaderWorkerSet
    group) reports one cache config per engine: its capacity is the sum of their blocks.
    """
    sums = {WAITING: 0.0, RUNNING: 0.0, KV_USAGE: 0.0}
    usage_seen: list[float] = []
    block_size = 0
    engine_blocks: dict[str, int] = {}
    per_engine: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name == CACHE_CONFIG:
            labels = dict(_LABEL.findall(line[name_end : line.rfind("}") + 1]))
            block_size = block_size or _int(labels.get("block_size"))
            engine_blocks[labels.get("engine", "")] = _int(labels.get("num_gpu_blocks"))
            continue
        key = ALIASES.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1] if "}" not in line else line[line.rfind("}") + 1 :].split()[0])
        except (IndexError, ValueError):
            continue
        if key == KV_USAGE:
            usage_seen.append(value)
        else:
            sums[key] += value
        engine = _engine_label(line, name_end)
        if engine is not None:
            gauges = per_engine.setdefault(engine, {})
            gauges[key] = gauges.get(key, 0.0) + value
    usage = max(usage_seen) if usage_seen else 0.0
    engines = {}
    if len(per_engine) > 1 or len(engine_blocks) > 1:
        for engine in per_engine.keys() | engine_blocks.keys():
            gauges = per_engine.get(engine, {})
            engines[engine] = WorkerMetrics(
                gauges.get(WAITING, 0.0), gauges.get(RUNNING, 0.0), gauges.get(KV_USAGE, 0.0), block_size,
                engine_blocks.get(engine, 0),
            )  # fmt: skip
    return WorkerMetrics(sums[WAITING], sums[RUNNING], usage, block_size, sum(engine_blocks.values()), engines)


def _engine_label(line: str, start: int) -> str | None:
    """The value of the sample's `engine` label, if it has one (a plain scan: hot enough to skip the regex)."""
    end = line.rfind("}")
    for mark in ('{engine="', ',engine="'):
        at = line.find(mark, start, end)
        if at >= 0:
            at += len(mark)
            return line[at : line.find('"', at, end)]
    return None


def _int(raw: str | None) -> int:
    try:
        return int(float(raw)) if raw else 0
    except ValueError:
        return 0
