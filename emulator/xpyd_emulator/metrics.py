"""vLLM's Prometheus metrics (DESIGN.md section 6), kept as plain numbers and rendered as text.

Hand-rolled rather than prometheus_client: an observation is a bisect and two additions, which
keeps the per-token cost of streaming small. Every sample carries `model_name` and `engine`.

A data-parallel replica's API server reports every engine (rank) it drives, each sample labelled
`engine="<rank>"`: gauges, counters, histograms and the cache config alike (vLLM's
v1/metrics/loggers.py PrometheusStatLogger, one child per entry of `engine_indexes`). One
EngineMetrics holds one engine's figures; `render_engines` writes a family once with every
engine's samples, as prometheus_client does.
"""

from __future__ import annotations

from bisect import bisect_left

from xpyd_api import metric_names as names

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class Histogram:
    """A Prometheus histogram: per-bucket counts, sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def render(self, name: str, labels: str, out: list[str]) -> None:
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_count{{{labels}}} {self.count}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")


class EngineMetrics:
    """The counters, gauges and histograms one emulated engine exposes at /metrics."""

    def __init__(self, model_name: str, block_size: int, num_gpu_blocks: int, engine: int = 0) -> None:
        self.labels = f'engine="{engine}",model_name="{model_name}"'
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.index_blocks = 0  # blocks in the prefix-cache index (xpyd's own gauge)
        self.success: dict[str, int] = {"length": 0, "stop": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue = Histogram(LATENCY_BUCKETS)

    def render(self) -> str:
        return render_engines([self])


def render_engines(engines: list[EngineMetrics]) -> str:
    """The text exposition of every engine's metrics, each family once (engines in rank order)."""
    out: list[str] = []

    def scalar(name: str, kind: str, help_: str, values: list[float]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for m, value in zip(engines, values, strict=True):
            out.append(f"{name}{{{m.labels}}} {value}")

    scalar(names.RUNNING, "gauge", "Number of requests in model execution batches.", [m.running for m in engines])
    scalar(names.WAITING, "gauge", "Number of requests waiting to be processed.", [m.waiting for m in engines])
    scalar(names.KV_USAGE, "gauge", "KV-cache usage. 1 means 100 percent usage.", [m.kv_usage for m in engines])
    scalar(names.PREFIX_QUERIES, "counter", "Prefix cache queries, in tokens.", [m.prefix_queries for m in engines])
    scalar(names.PREFIX_HITS, "counter", "Prefix cache hits, in tokens.", [m.prefix_hits for m in engines])
    scalar(names.PROMPT_TOKENS, "counter", "Number of prefill tokens processed.", [m.prompt_tokens for m in engines])
    scalar(names.GENERATION_TOKENS, "counter", "Number of generation tokens.", [m.generation_tokens for m in engines])
    scalar(names.PREEMPTIONS, "counter", "Cumulative number of preemptions.", [m.preemptions for m in engines])
    scalar(names.EMULATOR_PREFIX_INDEX_BLOCKS, "gauge", "Blocks in the emulator's prefix index.",
           [m.index_blocks for m in engines])  # fmt: skip
    out.append(f"# HELP {names.REQUEST_SUCCESS} Count of successfully processed requests.")
    out.append(f"# TYPE {names.REQUEST_SUCCESS} counter")
    for m in engines:
        for reason, n in m.success.items():
            out.append(f'{names.REQUEST_SUCCESS}{{{m.labels},finished_reason="{reason}"}} {n}')
    out.append(f"# HELP {names.CACHE_CONFIG} Information of the LLMEngine CacheConfig")
    out.append(f"# TYPE {names.CACHE_CONFIG} gauge")
    for m in engines:
        out.append(
            f'{names.CACHE_CONFIG}{{{m.labels},block_size="{m.block_size}",'
            f'enable_prefix_caching="True",num_gpu_blocks="{m.num_gpu_blocks}"}} 1.0'
        )
    for name, attr, help_ in (
        (names.TTFT, "ttft", "Histogram of time to first token in seconds."),
        (names.ITL, "itl", "Histogram of inter-token latency in seconds."),
        (names.E2E, "e2e", "Histogram of e2e request latency in seconds."),
        (names.QUEUE_TIME, "queue", "Histogram of time spent in WAITING phase."),
    ):
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} histogram")
        for m in engines:
            hist: Histogram = getattr(m, attr)
            hist.render(name, m.labels, out)
    out.append("")
    return "\n".join(out)
