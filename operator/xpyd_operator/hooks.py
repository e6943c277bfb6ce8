"""Extension point for periodic work beside the reconcile (the autoscaler plugs in here).

A module registers a hook with `on_resync(fn)`; the operator calls every hook once per resync
period with the DisaggregatedDeployments it watches. Modules listed in PLUGINS are imported at
startup when they exist, so `xpyd_operator/autoscaler.py` only has to call `on_resync` at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient

log = logging.getLogger("xpyd.operator")
PLUGINS: tuple[str, ...] = ("xpyd_operator.autoscaler",)


@dataclass
class ResyncContext:
    client: AsyncClient  # lightkube, field manager xpyd-operator (use your own for your fields)
    objects: list[dict[str, Any]]  # the DisaggregatedDeployments, as read this period
    interval: float  # seconds between resyncs
    memo: dict[str, Any] = field(default_factory=dict)  # kept across periods, per hook owner


ResyncHook = Callable[[ResyncContext], Awaitable[None]]
_HOOKS: list[ResyncHook] = []


def on_resync(hook: ResyncHook) -> ResyncHook:
    """Register `hook` (usable as a decorator)."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)
    return hook


def registered() -> list[ResyncHook]:
    return list(_HOOKS)


def load_plugins(names: tuple[str, ...] = PLUGINS) -> list[str]:
    """Import the plugin modules that exist; returns the names loaded."""
    loaded = []
    for name in names:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            loaded.append(name)
    return loaded


async def run_all(ctx: ResyncContext) -> None:
    for hook in registered():
        try:
            await hook(ctx)
        except Exception:  # one hook failing must not stop reconciles or other hooks
            log.exception("resync hook %s failed", getattr(hook, "__qualname__", hook))
