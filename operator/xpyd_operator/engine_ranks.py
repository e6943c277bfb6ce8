"""The shell words a rank of a multi-node replica needs, from the LeaderWorkerSet's environment.

A replica that spans nodes runs one pod per node; LeaderWorkerSet gives each pod LWS_LEADER_ADDRESS,
LWS_GROUP_SIZE and LWS_WORKER_INDEX (docs/architecture.md, "Multi-node replicas"). The leader
(index 0) runs the engine's API server; the other ranks join it with their engine's flags
(`xpyd_operator.engines.<kind>.rank_flags`). The start rank needs arithmetic at run time, so a
multi-node container runs `/bin/sh -c 'exec ...'`: literal words quoted, `Raw` words left for the shell.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Final, Literal

from xpyd_api import labels as L

Rank = Literal["leader", "worker"]
LEADER_ADDRESS: Final = "${" + L.ENV_LWS_LEADER_ADDRESS + "}"
WORKER_INDEX: Final = "${" + L.ENV_LWS_WORKER_INDEX + ":-0}"


@dataclass(frozen=True, slots=True)
class Raw:
    """A shell word that must reach the shell unquoted (it expands a variable or does arithmetic)."""

    text: str


Word = str | Raw


def shell(argv: list[Word]) -> list[str]:
    """`/bin/sh -c 'exec argv'`, every literal word quoted, every Raw word left for the shell to expand."""
    words = [w.text if isinstance(w, Raw) else shlex.quote(w) for w in argv]
    return ["/bin/sh", "-c", "exec " + " ".join(words)]
