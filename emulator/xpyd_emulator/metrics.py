"""The engine's Prometheus metrics (docs/operate.md, "Metrics"), kept as plain numbers and rendered as text.

The names are the engine's (`xpyd_api.engines.METRICS`): vLLM's, or SGLang's for its flavour, which
has no prefix-cache counters but a hit-rate gauge, and none of vLLM's cache-config, success or
preemption series.

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
from collections.abc import Callable

from xpyd_api import metric_names as names
from xpyd_api.engines import VLLM_METRICS, MetricNames

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# vLLM's NixlConnector series (v1/kv_transfer/kv_connector/v1/nixl_connector.py NixlPromMetrics): exported by a
# worker with --kv-transfer-config, observed on the decode side per transfer (its pull of a prefill's blocks)
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(1 << n) for n in range(20, 36, 2))  # 1 MiB to 32 GiB


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

    def __init__(
        self,
        model_name: str,
        block_size: int,
        num_gpu_blocks: int,
        engine: int = 0,
        labels: str | None = None,
        max_model_len: int = 131072,
    ) -> None:
        self.labels = labels or f'engine="{engine}",model_name="{model_name}"'
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.offload_hits = 0  # prompt tokens loaded from the CPU tier (vLLM: the connector's, not the GPU's)
        self.offloaded_blocks = 0  # blocks in the CPU tier
        self.cpu_tier = False  # a CPU tier is configured: its series are exported
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.index_blocks = 0  # blocks in the prefix-cache index (xpyd's own gauge)
        self.success: dict[str, int] = {"length": 0, "stop": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue = Histogram(LATENCY_BUCKETS)
        self.prompt_length = Histogram(names.token_buckets(max_model_len))  # observed as a request finishes
        self.nixl = False  # a KV connector is configured: the NIXL series are exported
        self.nixl_time = Histogram(NIXL_TIME_BUCKETS)
        self.nixl_bytes = Histogram(NIXL_BYTES_BUCKETS)
        self.nixl_failed = 0

    def render(self) -> str:
        return render_engines([self])


def render_engines(engines: list[EngineMetrics], engine: MetricNames = VLLM_METRICS) -> str:
    """The text exposition of every engine's metrics under `engine`'s names, each family once (in rank order)."""
    out: list[str] = []

    def scalar(name: str, kind: str, help_: str, values: list[float]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for m, value in zip(engines, values, strict=True):
            out.append(f"{name}{{{m.labels}}} {value}")

    scalar(engine.running, "gauge", "Number of requests in model execution batches.", [m.running for m in engines])
    scalar(engine.waiting, "gauge", "Number of requests waiting to be processed.", [m.waiting for m in engines])
    scalar(engine.kv_usage[0], "gauge", "KV-cache usage. 1 means 100 percent usage.", [m.kv_usage for m in engines])
    if engine.prefix_queries is not None and engine.prefix_hits is not None:
        scalar(
            engine.prefix_queries, "counter", "Prefix cache queries, in tokens.", [m.prefix_queries for m in engines]
        )
        scalar(engine.prefix_hits, "counter", "Prefix cache hits, in tokens.", [m.prefix_hits for m in engines])
    if engine.cache_hit_rate is not None:
        scalar(engine.cache_hit_rate, "gauge", "The prefix cache hit rate.",
               [m.prefix_hits / m.prefix_queries if m.prefix_queries else 0.0 for m in engines])  # fmt: skip
    scalar(engine.prompt_tokens, "counter", "Number of prefill tokens processed.", [m.prompt_tokens for m in engines])
    scalar(engine.generation_tokens, "counter", "Number of generation tokens.",
           [m.generation_tokens for m in engines])  # fmt: skip
    scalar(names.EMULATOR_PREFIX_INDEX_BLOCKS, "gauge", "Blocks in the emulator's prefix index.",
           [m.index_blocks for m in engines])  # fmt: skip
    if any(m.cpu_tier for m in engines):  # a CPU tier (KV offloading): what it holds and what it served
        scalar(names.EMULATOR_CPU_TIER_BLOCKS, "gauge", "Blocks in the emulator's CPU KV tier.",
               [m.offloaded_blocks for m in engines])  # fmt: skip
        scalar(names.EMULATOR_CPU_TIER_HITS, "counter", "Prompt tokens loaded from the CPU KV tier, not recomputed.",
               [m.offload_hits for m in engines])  # fmt: skip
    if engine is VLLM_METRICS:
        _vllm_only(engines, scalar, out)
    for name, attr, help_ in (
        (engine.ttft, "ttft", "Histogram of time to first token in seconds."),
        (engine.itl, "itl", "Histogram of inter-token latency in seconds."),
        (engine.e2e, "e2e", "Histogram of e2e request latency in seconds."),
        (engine.queue_time, "queue", "Histogram of time spent in WAITING phase."),
        *(
            [(engine.prompt_length, "prompt_length", "Number of prefill tokens processed.")]
            if engine.prompt_length
            else []
        ),
    ):
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} histogram")
        for m in engines:
            hist: Histogram = getattr(m, attr)
            hist.render(name, m.labels, out)
    if engine.kv_transfers and engine.kv_transfer_bytes and engine.kv_transfer_failures and engines[0].nixl:
        _nixl(engines, engine, scalar, out)
    out.append("")
    return "\n".join(out)


def _nixl(engines: list[EngineMetrics], engine: MetricNames, scalar: Callable[[str, str, str, list[float]], None],
          out: list[str]) -> None:  # fmt: skip
    """vLLM's NIXL transfer series, named as the profile names them (xpyd_api.engines)."""
    assert engine.kv_transfers and engine.kv_transfer_bytes and engine.kv_transfer_failures
    for name, attr, help_ in (
        (engine.kv_transfers, "nixl_time", "Histogram of transfer duration for NIXL KV Cache transfers."),
        (engine.kv_transfer_bytes, "nixl_bytes", "Number of bytes transferred per NIXL KV Cache transfers."),
    ):
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} histogram")
        for m in engines:
            hist: Histogram = getattr(m, attr)
            hist.render(name, m.labels, out)
    scalar(engine.kv_transfer_failures, "counter", "Number of failed NIXL KV Cache transfers.",
           [m.nixl_failed for m in engines])  # fmt: skip


def _vllm_only(engines: list[EngineMetrics], scalar: Callable[[str, str, str, list[float]], None],
               out: list[str]) -> None:  # fmt: skip
    """vLLM's series that no other engine's name map carries: preemptions, successes, the cache config."""
    scalar(names.PREEMPTIONS, "counter", "Cumulative number of preemptions.", [m.preemptions for m in engines])
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
