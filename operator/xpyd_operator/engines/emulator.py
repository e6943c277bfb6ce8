"""xpyd's worker emulator: the newest vLLM's command line behind `xpyd emulate --`, in the operator's image."""

from __future__ import annotations

from typing import Final

from xpyd_api.engines import EngineProfile
from xpyd_api.models import DisaggregatedDeploymentSpec, PoolSpec
from xpyd_operator.engines.vllm import VllmRenderer


class EmulatorRenderer(VllmRenderer):
    """The emulator reads vLLM's flags, so a pod of it runs what a vLLM pod would, prefixed."""

    def argv(self, spec: DisaggregatedDeploymentSpec, role: str, pool: PoolSpec, profile: EngineProfile) -> list[str]:
        return ["xpyd", "emulate", "--", *super().argv(spec, role, pool, profile)]

    def own_image(self) -> bool:
        return True


RENDERER: Final = EmulatorRenderer()
