"""What a DisaggregatedDeployment tells `xpyd plan --spec`: the handoff check's verdict and the flags it stands for.

This package reads no deployment spec (it sits below the API): the xpyd command reads the file with the
operator's own models and checks its prefill and decode as the operator does (xpyd_cli.planspec), and
hands the plan a SpecPlan. The plan prints its line, or its refusal as the one error line (exit 2), and
takes from it the model, topology and replica layout the command line leaves out. Pure: no I/O.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

# The replica layout flags: the spec's pool stands in for them only when the command line gives none.
LAYOUT: Final = ("gpus_per_replica", "tensor_parallel_size", "data_parallel_size", "expert_parallel")
_UNSET: Final[Mapping[str, object]] = {"data_parallel_size": 1, "expert_parallel": False}


@dataclass(frozen=True, slots=True)
class SpecPlan:
    """The handoff pre-flight of a deployment (or of --prefill-tp/--decode-tp) and the plan flags it implies."""

    line: str  # "handoff: compatible (...)", "handoff: none (...)": printed above the table
    refusal: str | None = None  # the operator's refusal: the plan's error line instead of a table
    detail: Mapping[str, object] = field(default_factory=dict)  # --json's "handoff"
    flags: Mapping[str, object] = field(default_factory=dict)  # argparse dest -> value, where the command line has none


@dataclass(frozen=True, slots=True)
class SpecAsk:
    """What `xpyd plan` was asked to check: a deployment file and/or each pool's tensor parallel size."""

    spec: str | None
    prefill_tp: int | None
    decode_tp: int | None
    model: str | None  # --model, for a check without a spec
    topology: str | None  # --topology, likewise


Preflight = Callable[[SpecAsk], SpecPlan]  # the xpyd command's reader (xpyd_cli.planspec.preflight)


def asked(args: argparse.Namespace) -> SpecAsk | None:
    """The check the command line asks for; None when it names no spec and no pool's tensor parallel."""
    if args.spec is None and args.prefill_tp is None and args.decode_tp is None:
        return None
    for flag in ("prefill_tp", "decode_tp"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    return SpecAsk(args.spec, args.prefill_tp, args.decode_tp, args.model, args.topology)


def apply(args: argparse.Namespace, plan: SpecPlan) -> None:
    """Fills the flags the command line left unset from the spec (the layout only as a whole)."""
    layout_given = any(getattr(args, dest) not in (None, _UNSET.get(dest)) for dest in LAYOUT)
    for dest, value in plan.flags.items():
        if dest in LAYOUT and layout_given:
            continue
        if dest == "shape":
            if args.model_config is None and args.model in (None, plan.flags.get("model")):
                args.shape = value  # the spec's inline config.json, unless --model-config or another --model
            continue
        if getattr(args, dest, None) in (None, _UNSET.get(dest)):
            setattr(args, dest, value)
