"""The knobs of one simulation run that are not part of the deployment spec."""

from __future__ import annotations

from dataclasses import dataclass, field

from xpyd_sim.kvevents import IndexMode
from xpyd_sim.metrics import Slo
from xpyd_sim.routing import DpRouting


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one run that are not part of the deployment spec."""

    router: str = "kv-aware"
    autoscaler: str = "off"
    slo: Slo = field(default_factory=Slo)
    max_requests: int | None = None
    duration_s: float | None = None  # arrivals after this are not replayed
    token_budget: int = 8192  # vLLM max_num_batched_tokens
    max_seqs: int = 256  # vLLM max_num_seqs
    block_tokens: int = 512  # prefix block size of the trace's ids
    startup_s: float = 60.0  # a new replica's time to Ready (image cached, weights loaded)
    scrape_s: float = 1.0  # the router's /metrics scrape interval
    interval_s: float | None = None  # autoscaler interval; the spec's when None
    autoscaler_targets: tuple[tuple[str, float], ...] = ()  # spec.autoscaling.targets keys (camelCase)
    router_replicas: int | None = None  # routers sharing no state; the spec's router.replicas when None
    router_index: IndexMode = "own"  # what feeds each replica's prefix index: its own routes and/or KV events
    event_delay_s: float = 0.05  # a KV event's way from the engine into every router replica's index
    cache_tokens: int | None = None  # cap each worker's prefix cache below its free KV (a smaller cache)
    peer_sync_s: float = 0.0  # router replicas exchange their in-flight counts this often (0: never)
    sample_s: float = 10.0  # timeline resolution
    dp_routing: DpRouting = "ranks"  # a data-parallel replica: one target per rank, or one (its engine picks)
    # KV offloading: host memory per replica for a CPU KV tier, in bytes (0: none, unless the spec's pools
    # set one), for the pools that compute prompts (prefill, co-located; decode too with offload_decode)
    offload_bytes: int = 0
    offload_decode: bool = False
    # what the router's `tiers` scorer prices a CPU-held block by: the pool's model, GPU and link (the
    # router knows them); False: the router scores GPU-held blocks only (the CPU tier counts nothing)
    tier_pricing: bool = True
    # count a CPU-held block at this fixed share of a GPU-held one instead (the router's --cpu-tier-weight;
    # llm-d's rule: 0.4); None: as tier_pricing says
    cpu_block_weight: float | None = None
