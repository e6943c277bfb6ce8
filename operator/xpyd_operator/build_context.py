"""The frozen context a pool's builders read: whose pool, which spec and role, where it runs, which image.

The pool builders (xpyd_operator.pools, groups, engine, podneeds) take one `PoolBuild` instead of long
positional lists: the pool itself is `spec.pools()[role]`, and the node selector, the NVLink clique
the pool is pinned to and whether its pods hold a ComputeDomain channel all come from one placement.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from xpyd_api.layout import ReplicaLayout
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator.meta import Owner
from xpyd_operator.placement import Placement


@dataclass(frozen=True, slots=True)
class PoolBuild:
    """One pool of one deployment, as the builders see it."""

    owner: Owner
    spec: DisaggregatedDeploymentSpec
    role: str  # prefill, decode, or worker (Colocated)
    image: str  # the operator's own image (the emulator engine and the helper containers run it)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    clique: str | None = None  # the NVLink domain (rack) the pool is pinned to; None when unpinned
    compute_domain: bool = False  # the deployment has a ComputeDomain (its pods hold the rack's IMEX channel)

    def __post_init__(self) -> None:
        if self.role not in self.spec.pools():
            raise ValueError(f"the spec has no {self.role} pool (it has {', '.join(self.spec.pools())})")

    @classmethod
    def placed(
        cls, owner: Owner, spec: DisaggregatedDeploymentSpec, role: str, placement: Placement, compute_domain: bool,
        image: str,
    ) -> PoolBuild:  # fmt: skip
        """The context of `role` where `placement` put the deployment."""
        return cls(owner, spec, role, image, placement.node_selector, placement.pins.get(role), compute_domain)

    @property
    def pool(self) -> PoolSpec:
        return self.spec.pools()[self.role]

    @property
    def layout(self) -> ReplicaLayout:
        return self.pool.layout(self.spec.topology.hardware)

    @property
    def imex(self) -> bool:
        """Every pod of the pool holds the rack's IMEX channel: a ComputeDomain and a pinned rack."""
        return self.compute_domain and self.clique is not None
