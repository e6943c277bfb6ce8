"""The simulated pools: replicas placed in NVLink domains, started, drained and counted in GPU-hours."""

from __future__ import annotations

import math

from xpyd_perf import Topology
from xpyd_perf.fits import pods_per_replica
from xpyd_sim.perfmodel import PoolPerf
from xpyd_sim.spec import SimSpec
from xpyd_sim.worker import Worker


class Cluster:
    """Replicas by role, placed first-fit into NVLink domains (nodes on HGX, cliques on NVL72).

    The first replicas are placed interleaved (P, D, D, P, ...) so that on NVL72 a deployment that
    fits one clique lands in it, as the operator places it; later ones take the first free slot.
    A multi-node replica (a LeaderWorkerSet group) is one replica of all its GPUs: inside one clique
    on NVL72; on HGX, where NVLink ends at the node, it takes whole empty nodes and is named after
    its leader's. The autoscaler adds and removes whole replicas, so whole groups.
    """

    def __init__(
        self,
        spec: SimSpec,
        perfs: dict[str, PoolPerf],
        *,
        token_budget: int,
        max_seqs: int,
        block_tokens: int,
        cache_tokens: int | None = None,
        offload_tokens: dict[str, int] | None = None,
    ) -> None:
        self.spec = spec
        self.topology: Topology = spec.topology
        self.perfs = perfs
        self.token_budget = token_budget
        self.max_seqs = max_seqs
        self.block_tokens = block_tokens
        self.cache_tokens = cache_tokens
        self.offload_tokens = offload_tokens or {}  # per role: a replica's CPU KV tier, in tokens (0: none)
        self.domain_size = max(self.topology.domain_gpus, 1)
        self.domain_used: list[int] = []
        self._slots: dict[str, list[tuple[int, int]]] = {}  # worker name -> (domain index, GPUs) it holds
        self.workers: dict[str, list[Worker]] = {role: [] for role in spec.pools}
        self.retired: list[Worker] = []
        self._next = dict.fromkeys(spec.pools, 0)
        self._gpus_alive = 0
        self._t = 0.0
        self.gpu_seconds = 0.0
        order: list[tuple[float, str]] = []
        for role, pool in spec.pools.items():
            order += [(i / pool.replicas, role) for i in range(pool.replicas)]
        for _, role in sorted(order):
            self.add(role, 0.0, ready=True)

    def _place(self, gpus: int) -> list[tuple[int, int]]:
        """The domains a replica takes: room in one domain, or whole empty domains (nodes) for a group
        larger than one; new domains are added as needed (the cluster grows to fit)."""
        if gpus <= self.domain_size:
            i = next((i for i, used in enumerate(self.domain_used) if used + gpus <= self.domain_size), None)
            if i is None:
                self.domain_used.append(0)
                i = len(self.domain_used) - 1
            self.domain_used[i] += gpus
            return [(i, gpus)]
        whole = math.ceil(gpus / self.domain_size)
        free = [i for i, used in enumerate(self.domain_used) if used == 0][:whole]
        while len(free) < whole:
            self.domain_used.append(0)
            free.append(len(self.domain_used) - 1)
        slots: list[tuple[int, int]] = []
        for i in free:
            take = min(self.domain_size, gpus - sum(g for _, g in slots))
            self.domain_used[i] += take
            slots.append((i, take))
        return slots

    def pods(self, role: str) -> int:
        """Pods one replica of `role` takes: one per node it spans (a LeaderWorkerSet group beyond one)."""
        return pods_per_replica(self.topology, self.spec.pools[role].gpus)

    def _account(self, now: float) -> None:
        self.gpu_seconds += self._gpus_alive * (now - self._t)
        self._t = now

    def add(self, role: str, now: float, ready: bool) -> Worker:
        """A new replica of `role`; GPUs count from now on, even while it starts."""
        pool = self.spec.pools[role]
        self._account(now)
        slots = self._place(pool.gpus)
        perf = self.perfs[role]
        ranks = perf.parallel.dp if perf.parallel is not None else 1  # vLLM's batch limits are per data-parallel rank
        w = Worker(
            self._next[role],
            role,
            f"{self.topology.nvlink_domain}-{slots[0][0]}",  # a group's domain is its leader's
            self.perfs[role],
            gpus=pool.gpus,
            block_tokens=self.block_tokens,
            token_budget=self.token_budget * ranks,
            max_seqs=self.max_seqs * ranks,
            cache_tokens=self.cache_tokens,
            ranks=pool.dp,  # one prefix cache per data-parallel rank
            cpu_blocks=self.offload_tokens.get(role, 0) // self.block_tokens,
        )
        self._next[role] += 1
        self._slots[w.name] = slots
        w.state = "ready" if ready else "starting"
        w.born = now
        self._gpus_alive += w.gpus
        self.workers[role].append(w)
        return w

    def retire(self, w: Worker, now: float) -> None:
        """The replica is gone: its GPUs stop counting and its slot is free."""
        self._account(now)
        w.state = "gone"
        w.died = now
        self._gpus_alive -= w.gpus
        for i, gpus in self._slots.pop(w.name, []):
            self.domain_used[i] -= gpus
        self.workers[w.role].remove(w)
        self.retired.append(w)

    def ready(self, role: str) -> list[Worker]:
        return [w for w in self.workers[role] if w.state == "ready"]

    def replicas(self, role: str) -> int:
        """The size asked of the pool: ready and starting replicas, not draining ones."""
        return sum(1 for w in self.workers[role] if w.state in ("ready", "starting"))

    def all_workers(self) -> list[Worker]:
        return [w for ws in self.workers.values() for w in ws] + self.retired

    def gpu_hours(self, now: float) -> float:
        self._account(now)
        return self.gpu_seconds / 3600.0
