"""The operator's side of the engine seam: a spec's engine profile and the argv module of its kind.

`profile_of(spec)` resolves spec.engine (kind, image, version) to the shared profile
(`xpyd_api.engines`); `renderer(kind)` is the kind's module of command line, rank flags,
environment and ports. Nothing outside this package branches on an engine's kind or release.
"""

from __future__ import annotations

from typing import Any, Protocol

from xpyd_api import engines as profiles
from xpyd_api.engines import EngineProfile, EngineUnsupported
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator.engine_ranks import Rank, Word

__all__ = [
    "EngineProfile",
    "EngineUnsupported",
    "Renderer",
    "default_image",
    "kv_offload_bytes",
    "profile_of",
    "renderer",
]


class Renderer(Protocol):
    """What one engine kind renders for a pool's containers."""

    def argv(self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile) -> list[str]:
        """The engine's command line for one pool (a multi-node replica's rank flags come on top)."""
        ...

    def rank_flags(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, rank: Rank, profile: EngineProfile
    ) -> list[Word]:
        """The flags of one rank of a replica that spans pods."""
        ...

    def env(
        self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile
    ) -> list[tuple[str, str]]:
        """Environment this kind and release need (after the generic pod environment, before the user's)."""
        ...

    def ports(self, role: str, rank: Rank | None) -> list[dict[str, Any]]:
        """Container ports this kind serves besides HTTP and the KV-event ports."""
        ...

    def join_port(self) -> int:
        """Where the other ranks of a multi-node replica meet its leader (the leader's rank-join port)."""
        ...

    def kv_events_config(self, base: dict[str, object]) -> dict[str, object]:
        """`--kv-events-config` from the shared publisher settings (ZMQ endpoints, topic), in the kind's keys."""
        ...

    def own_image(self) -> bool:
        """Whether the kind runs the operator's own image (the emulator) rather than the engine's."""
        ...


def profile_of(spec: DisaggregatedDeploymentSpec) -> EngineProfile:
    """The profile serving spec.engine; EngineUnsupported names a kind or release xpyd cannot serve."""
    return profiles.resolve(spec.engine.kind, spec.engine.image, spec.engine.version)


def kv_offload_bytes(spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec) -> int:
    """Host memory one pod of `pool` takes for its kvOffload CPU tier (0: none rendered for this engine)."""
    from xpyd_operator.engines import offload

    return offload.pod_bytes(spec, role, pool, profile_of(spec))


def default_image(kind: str) -> str:
    return profiles.default_image(kind)


def renderer(kind: str) -> Renderer:
    from xpyd_operator.engines import emulator, sglang, vllm

    found: dict[str, Renderer] = {"vllm": vllm.RENDERER, "sglang": sglang.RENDERER, "emulator": emulator.RENDERER}
    if kind not in found:
        raise EngineUnsupported(f"engine kind {kind!r} has no renderer; xpyd serves {', '.join(found)}")
    return found[kind]
