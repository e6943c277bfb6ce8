"""The simulated pools: replicas placed in NVLink domains, started, drained and counted in GPU-hours."""

from __future__ import annotations

from xpyd_perf import Topology
from xpyd_sim.perfmodel import PoolPerf
from xpyd_sim.spec import SimSpec
from xpyd_sim.worker import Worker


class Cluster:
    """Replicas by role, placed first-fit into NVLink domains (nodes on HGX, cliques on NVL72).

    The first replicas are placed interleaved (P, D, D, P, ...) so that on NVL72 a deployment that
    fits one clique lands in it, as the operator places it; later ones take the first free slot.
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
    ) -> None:
        self.spec = spec
        self.topology: Topology = spec.topology
        self.perfs = perfs
        self.token_budget = token_budget
        self.max_seqs = max_seqs
        self.block_tokens = block_tokens
        self.cache_tokens = cache_tokens
        self.domain_size = max(self.topology.domain_gpus, 1)
        self.domain_used: list[int] = []
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

    def _place(self, gpus: int) -> str:
        kind = self.topology.nvlink_domain
        for i, used in enumerate(self.domain_used):
            if used + gpus <= self.domain_size:
                self.domain_used[i] += gpus
                return f"{kind}-{i}"
        self.domain_used.append(gpus)
        return f"{kind}-{len(self.domain_used) - 1}"

    def _account(self, now: float) -> None:
        self.gpu_seconds += self._gpus_alive * (now - self._t)
        self._t = now

    def add(self, role: str, now: float, ready: bool) -> Worker:
        """A new replica of `role`; GPUs count from now on, even while it starts."""
        pool = self.spec.pools[role]
        self._account(now)
        w = Worker(
            self._next[role],
            role,
            self._place(pool.gpus),
            self.perfs[role],
            gpus=pool.gpus,
            block_tokens=self.block_tokens,
            token_budget=self.token_budget,
            max_seqs=self.max_seqs,
            cache_tokens=self.cache_tokens,
        )
        self._next[role] += 1
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
        self.domain_used[int(w.domain.rsplit("-", 1)[1])] -= w.gpus
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
