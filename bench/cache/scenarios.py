"""The suite's scenarios: a workload shape, a request rate, a deployment and a cache size each."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bench.cache import workloads as wl

from xpyd_sim import spec as specs
from xpyd_sim.perfmodel import PoolPerf
from xpyd_sim.spec import SimSpec
from xpyd_sim.trace import TraceRequest

HERE = Path(__file__).resolve().parent
SIM_SPECS = HERE.parent / "sim"
SMALL = 0.5  # "small": the first-hop pool's caches together hold half the working set


@dataclass(frozen=True)
class Scenario:
    name: str
    shape: str  # chat | rag | agent | mooncake | azure-conv | azure-code
    rate: float  # the synthetic generator's rate (requests/s); traces replay at their own
    deployment: str  # single-pool (4 x Llama-3.1-8B on one H100 each) or two-hop deployments
    cache: str  # small | large | n/a (a trace without prefix ids)
    seed: int = 0
    duration_s: float = 300.0


DEPLOYMENTS: dict[str, tuple[Path, str | None, dict[str, int]]] = {
    "8B 4W": (HERE / "llama8b-colocated.yaml", "H100", {}),
    "8B 2P2D": (HERE / "llama8b-pd.yaml", "H100", {}),
    "70B 2P4D": (SIM_SPECS / "llama70b-hgx.yaml", None, {"prefill": 2, "decode": 4}),
    "70B-TP2 4P2D": (SIM_SPECS / "llama70b-tp2.yaml", None, {"prefill": 4, "decode": 2}),
}

SCENARIOS = [
    Scenario("chat-20rps-small", "chat", 26, "8B 4W", "small"),
    Scenario("chat-28rps-small", "chat", 40, "8B 4W", "small"),
    Scenario("chat-28rps-large", "chat", 40, "8B 4W", "large"),
    Scenario("chat-2hop-small", "chat", 30, "8B 2P2D", "small"),
    Scenario("rag-small", "rag", 22, "8B 4W", "small"),
    Scenario("rag-large", "rag", 22, "8B 4W", "large"),
    Scenario("agent-small", "agent", 15, "8B 4W", "small"),
    Scenario("agent-large", "agent", 15, "8B 4W", "large"),
    Scenario("mooncake-conv-large", "mooncake", 0, "70B 2P4D", "large"),
    Scenario("mooncake-conv-small", "mooncake", 0, "70B 2P4D", "small"),
    Scenario("azure-conv", "azure-conv", 0, "70B-TP2 4P2D", "n/a"),
    Scenario("azure-code", "azure-code", 0, "70B-TP2 4P2D", "n/a"),
]


def block_tokens(sc: Scenario) -> int:
    return 64 if sc.shape in wl.SYNTHETIC else 512


@cache
def load(sc: Scenario) -> tuple[TraceRequest, ...]:
    if sc.shape in wl.SYNTHETIC:
        return tuple(wl.SYNTHETIC[sc.shape](wl.Shape(rate=sc.rate, duration=sc.duration_s, seed=sc.seed)))
    if sc.shape == "mooncake":
        return tuple(wl.mooncake())
    kind = sc.shape.removeprefix("azure-")
    return tuple(wl.azure(kind, copies=4 if kind == "conv" else 1))  # conv: the load bench/sim replays


def spec(sc: Scenario) -> SimSpec:
    path, topology, pools = DEPLOYMENTS[sc.deployment]
    s = specs.load(path, topology=topology)
    return s.with_pools(**pools) if pools else s


def first_pool(s: SimSpec) -> tuple[int, int]:
    """(replicas, KV capacity in tokens per replica) of the pool that computes prompts."""
    role = "worker" if "worker" in s.pools else "prefill"
    p = s.pools[role]
    return p.replicas, PoolPerf(s.model, s.topology.gpu, p.tp, p.gpus, s.kv_bytes_per_token).kv_capacity_tokens


def cache_tokens(sc: Scenario) -> int | None:
    """The prefix-cache cap per worker: half the working set over the first-hop pool when small."""
    if sc.cache != "small":
        return None
    replicas, _ = first_pool(spec(sc))
    return int(wl.working_set_tokens(list(load(sc)), block_tokens(sc)) * SMALL / replicas)


def describe(sc: Scenario) -> dict[str, object]:
    """What a scenario's table row says about its load and its caches."""
    reqs = list(load(sc))
    bt = block_tokens(sc)
    replicas, kv = first_pool(spec(sc))
    ws = wl.working_set_tokens(reqs, bt)
    per_worker = min(kv, cache_tokens(sc) or kv)
    span = (reqs[-1].arrival - reqs[0].arrival) if len(reqs) > 1 else 1.0
    return {
        "requests": len(reqs),
        "rate": round(len(reqs) / span, 1),
        "working_set_tokens": ws,
        "cache_tokens_per_worker": per_worker,
        "cache_vs_working_set": round(replicas * per_worker / ws, 2) if ws else None,
        "ideal_hit_ratio": round(wl.ideal_hit_ratio(reqs, bt), 3),
    }
