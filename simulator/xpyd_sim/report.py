"""Turns a finished simulation into the one JSON object `xpyd simulate --json` prints."""

from __future__ import annotations

import resource
import sys
from typing import Any

from xpyd_sim.engine import Simulation
from xpyd_sim.metrics import Histogram
from xpyd_sim.spec import replica_fits


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def imbalance(sim: Simulation) -> float | None:
    """max/mean requests per worker of the first-hop pool, per second each worker was alive."""
    end = sim.end_time
    rates = []
    for w in sim.cluster.all_workers():
        if w.role != sim.first_role:
            continue
        life = (w.died if w.died >= 0 else end) - w.born
        if life > 0 and w.routed:
            rates.append(w.routed / life)
    if not rates:
        return None
    return round(max(rates) / (sum(rates) / len(rates)), 4)


def _downsample(rows: list[tuple[float, int, int, int, int]], limit: int = 400) -> list[list[float]]:
    stride = max(1, len(rows) // limit)
    return [[round(r[0], 1), r[1], r[2], r[3], r[4]] for r in rows[::stride]]


def build(sim: Simulation, wall_s: float, cpu_s: float | None = None) -> dict[str, Any]:
    """Every figure of one run; latency keys follow `<metric>_p<q>_s`."""
    m = sim.metrics
    spec = sim.spec
    itl = Histogram()
    for h in sim.itl.values():
        itl.merge(h)
    m.itl = itl
    workers = sim.cluster.all_workers()
    queried = sum(w.stats[0] for w in workers)
    hit = sum(w.stats[1] for w in workers)  # GPU hits and reloads from the CPU tier
    reloaded = sum(w.reloaded for w in workers)
    completed = len(m.ttft)
    out: dict[str, Any] = {
        "deployment": spec.name,
        "mode": spec.mode,
        "xpyd": spec.label,
        "model": spec.model.key,
        "topology": spec.topology.name,
        "gpu": spec.topology.gpu.name,
        "router": sim.cfg.router,
        "autoscaler": sim.scaler.name,
        "requests": sim.arrived,
        "completed": completed,
        "rejected": sim.rejected,
        "unfinished": sim.arrived - completed - sim.rejected,
    }
    out.update(m.latency_report())
    sim_s = max(sim.end_time, sim.last_arrival)
    hours = sim.cluster.gpu_hours(sim_s)
    out.update(
        {
            "gpu_hours": round(hours, 3),
            "prefix_hit_ratio": round(hit / queried, 4) if queried else 0.0,
            # of those prompt tokens not computed, the share found on the GPU and the share reloaded
            # from a CPU KV tier (KV offloading); they sum to prefix_hit_ratio
            "gpu_hit_ratio": round((hit - reloaded) / queried, 4) if queried else 0.0,
            "cpu_hit_ratio": round(reloaded / queried, 4) if queried else 0.0,
            "reloaded_tokens": reloaded,
            "imbalance": imbalance(sim),
            "direct_requests": m.direct,
            "kv_bytes_nvlink": m.kv_bytes["nvlink"],
            "kv_bytes_nic": m.kv_bytes["rdma"],
            "handoffs_nvlink": m.handoffs["nvlink"],
            "handoffs_rdma": m.handoffs["rdma"],
            "decode_rerouted": sim.rerouted,
            "output_tokens_per_s": round(m.output_tokens / sim_s, 2) if sim_s > 0 else None,
            "output_tokens_per_gpu_hour": round(m.output_tokens / hours, 1) if hours > 0 else None,
            "router_decisions": dict(sorted(sim.router.decisions.items())),
            "scale_events": len(m.scale_events),
            "replicas_max": _max_replicas(m.timeline, spec.mode),
            "gpus_per_replica": {role: p.gpus for role, p in spec.pools.items()},
            "pods_per_replica": {role: sim.cluster.pods(role) for role in spec.pools},
            "replica_fit": {role: fit.summary() for role, fit in replica_fits(spec).items()},
            "replicas": _downsample(m.timeline),
            "replicas_columns": ["t_s", "prefill_or_worker", "decode", "queued", "running"],
            "simulated_s": round(sim_s, 3),
            "wall_s": round(wall_s, 3),
            "cpu_s": round(cpu_s, 3) if cpu_s is not None else None,
            "events": sim.events,
            # per CPU-second of the simulation loop (wall time when not measured), robust to shared cores
            "events_per_s": round(sim.events / (cpu_s or wall_s)) if (cpu_s or wall_s) > 0 else None,
            "peak_rss_mb": peak_rss_mb(),
        }
    )
    return out


def _max_replicas(rows: list[tuple[float, int, int, int, int]], mode: str) -> dict[str, int]:
    if mode == "Colocated":
        return {"worker": max((r[1] for r in rows), default=0)}
    return {"prefill": max((r[1] for r in rows), default=0), "decode": max((r[2] for r in rows), default=0)}
