"""The KV handoff seam: one module per engine protocol, picked by the engine kind's profile.

`xpyd_api.engines` says which protocol each engine kind speaks (`EngineProfile.handoff`); a new
protocol is one module here with a `Handoff` subclass and one entry in `make`.
"""

from __future__ import annotations

from xpyd_api import engines
from xpyd_router.handoff.base import Handoff, HopFailed, Legs
from xpyd_router.handoff.bootstrap import Bootstrap
from xpyd_router.handoff.nixl import Nixl

__all__ = ["Handoff", "HopFailed", "Legs", "for_engine", "make"]


def make(protocol: engines.Handoff, bootstrap_port: int) -> Handoff:
    """The handoff of one protocol (its settings given)."""
    if protocol == "nixl":
        return Nixl()
    if protocol == "bootstrap":
        return Bootstrap(bootstrap_port)
    raise engines.EngineUnsupported(f"handoff protocol {protocol!r} has no module in xpyd_router.handoff")


def for_engine(kind: str, bootstrap_port: int) -> Handoff:
    """The handoff an engine kind's newest release speaks; EngineUnsupported for an unknown kind."""
    return make(engines.newest(kind).handoff, bootstrap_port)
