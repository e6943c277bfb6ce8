"""Routing to data-parallel ranks vs the engine's balancing, simulated on DeepSeek-R1 wide-EP deployments.

A vLLM replica of DeepSeek-R1 with DP attention and expert parallel (one API server over D engine
ranks) keeps one prefix cache per rank. `ranks`: the router sees one target per rank and pins it
(what xpyd's router does for vLLM); `engine`: the router sees the replica and vLLM's API server picks
the rank with the fewest waiting * 4 + running. Both run over the same requests, in the same process,
with the product's policy (kv-aware, its index fed by the ranks' KV events); only the mode differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.cache import workloads as wl

from xpyd_sim import spec as specs
from xpyd_sim import trace as traces
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.report import build
from xpyd_sim.routing import DP_ROUTINGS, DpRouting
from xpyd_sim.spec import SimSpec
from xpyd_sim.trace import TraceRequest

MODEL = "deepseek-ai/DeepSeek-R1-0528"
TOOLAGENT = wl.TRACES / "toolagent_trace.jsonl"  # Mooncake's tool-agent trace, when a checkout has it


@dataclass(frozen=True)
class Deployment:
    """A disaggregated DeepSeek-R1 deployment: (replicas, data-parallel ranks) per pool, one GPU per rank."""

    name: str
    topology: str
    prefill: tuple[int, int]
    decode: tuple[int, int]

    @property
    def gpus(self) -> int:
        return self.prefill[0] * self.prefill[1] + self.decode[0] * self.decode[1]

    def spec(self) -> SimSpec:
        def pool(shape: tuple[int, int]) -> dict[str, object]:
            replicas, dp = shape
            return {"replicas": replicas, "gpusPerReplica": dp, "dataParallelSize": dp, "expertParallel": True}

        doc = {
            "apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment", "metadata": {"name": self.name},
            "spec": {"model": {"name": MODEL}, "topology": {"kind": self.topology},
                     "engine": {"kind": "vllm", "args": ["--max-model-len", "32768"]},
                     "prefill": pool(self.prefill), "decode": pool(self.decode)},
        }  # fmt: skip
        return specs.parse(doc)


# The wide-EP units of bench/moe/simulate.py, sized to the Mooncake trace's prompt load: DP16 prefill
# replicas of two HGX nodes each beside one DP32 decode replica of four nodes or two DP16 ones; on one
# GB200-NVL72 rack, DP16 prefill and DP32 decode inside its NVLink domain (64 of its 72 GPUs).
DEPLOYMENTS = (
    Deployment("HGX-B200 3P(DP16) 1D(DP32)", "HGX-B200", (3, 16), (1, 32)),
    Deployment("HGX-B200 3P(DP16) 2D(DP16)", "HGX-B200", (3, 16), (2, 16)),
    Deployment("GB200-NVL72 2P(DP16) 1D(DP32)", "GB200-NVL72", (2, 16), (1, 32)),
)


@dataclass(frozen=True)
class Workload:
    """A request stream: a trace replayed as it is, or a synthetic shape at `rate` (seeded)."""

    name: str
    kind: str  # "mooncake", "toolagent" or a key of bench.cache.workloads.SYNTHETIC
    rate: float = 0.0
    duration_s: float = 300.0

    @property
    def block_tokens(self) -> int:
        return 64 if self.kind in wl.SYNTHETIC else 512  # the traces' hash ids cover 512 tokens

    def available(self) -> bool:
        return self.kind != "toolagent" or TOOLAGENT.is_file()

    def load(self, seed: int, quick: bool) -> list[TraceRequest]:
        if self.kind in wl.SYNTHETIC:
            duration = min(self.duration_s, 120.0) if quick else self.duration_s
            return wl.SYNTHETIC[self.kind](wl.Shape(rate=self.rate, duration=duration, seed=seed))
        path = wl.TRACES / "conversation_trace.jsonl" if self.kind == "mooncake" else TOOLAGENT
        load = list(traces.load(path))
        return load[:3000] if quick else load

    def seeds(self, seeds: Sequence[int]) -> list[int]:
        return list(seeds) if self.kind in wl.SYNTHETIC else [0]


WORKLOADS = (
    Workload("mooncake-conv", "mooncake"),
    Workload("mooncake-toolagent", "toolagent"),
    Workload("chat-30rps", "chat", rate=30.0),
    Workload("agent-10rps", "agent", rate=10.0),
)
SEEDS = (0, 1, 2)
METRICS = (
    "prefix_hit_ratio", "ttft_p50_s", "ttft_p99_s", "slo_attainment", "tokens_computed", "prefill_gpu_s", "itl_p99_s",
)  # fmt: skip


def measure(deployment: SimSpec, load: Iterable[TraceRequest], mode: DpRouting, block_tokens: int) -> dict[str, Any]:
    """One simulation: the report's figures, prompt tokens computed anywhere and the prefill pool's busy GPU-s."""
    cfg = SimConfig(router="kv-aware", router_index="events", block_tokens=block_tokens, dp_routing=mode)
    sim = Simulation(deployment, load, cfg)
    start, cpu = time.perf_counter(), time.process_time()
    sim.run()
    res = build(sim, time.perf_counter() - start, time.process_time() - cpu)
    workers = sim.cluster.all_workers()
    res["tokens_computed"] = sum(w.stats[2] for w in workers)
    res["prefill_gpu_s"] = sum(w.busy_s * w.gpus for w in workers if w.role == "prefill")
    return res


def run(
    deployments: Sequence[Deployment] | None = None,
    workloads: Sequence[Workload] | None = None,
    seeds: Sequence[int] = SEEDS,
    quick: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every deployment x workload (DEPLOYMENTS x WORKLOADS unless given) in both modes, the synthetic
    shapes over `seeds` (means reported)."""
    say = log or (lambda _msg: None)
    deployments = DEPLOYMENTS if deployments is None else deployments
    workloads = WORKLOADS if workloads is None else workloads
    rows: list[dict[str, Any]] = []
    skipped = [w.name for w in workloads if not w.available()]
    start, cpu = time.perf_counter(), time.process_time()
    for dep in deployments:
        spec = dep.spec()
        for work in workloads:
            if not work.available():
                continue
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in DP_ROUTINGS}
            requests = 0
            for seed in work.seeds(seeds):
                load = work.load(seed, quick)
                requests = len(load)
                for mode in DP_ROUTINGS:
                    runs[mode].append(measure(spec, load, mode, work.block_tokens))
            row: dict[str, Any] = {"deployment": dep.name, "gpus": dep.gpus, "workload": work.name}
            row |= {"requests": requests, "seeds": len(work.seeds(seeds))}
            for name, each in runs.items():
                row[name] = {k: sum(float(r[k] or 0.0) for r in each) / len(each) for k in METRICS}
            rows.append(row)
            r, e = row["ranks"], row["engine"]
            say(
                f"{dep.name} / {work.name}: hit {r['prefix_hit_ratio']:.3f} vs {e['prefix_hit_ratio']:.3f}, "
                f"TTFT p99 {r['ttft_p99_s']:.2f} vs {e['ttft_p99_s']:.2f} s"
            )
    return {
        "rows": rows,
        "skipped": skipped,
        "wall_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu,
        "quick": quick,
        "seeds": list(seeds),
        "deployments": list(deployments),
        "workloads": [w for w in workloads if w.available()],
    }
