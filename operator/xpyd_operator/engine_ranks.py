"""Each rank's engine command line in a multi-node replica, from the LeaderWorkerSet's environment.

A replica that spans nodes runs one pod per node; LeaderWorkerSet gives each pod LWS_LEADER_ADDRESS,
LWS_GROUP_SIZE and LWS_WORKER_INDEX (DESIGN.md section 11, REFERENCES.md (b)/(c)). The leader
(index 0) runs the engine's API server; the other ranks join it:
- vLLM data/expert parallel: every pod runs `--data-parallel-size-local` ranks, meets the leader at
  `--data-parallel-address`/`--data-parallel-rpc-port`; non-leaders are `--headless` and start at
  rank index x local ranks (vLLM >= 0.10). Tensor/pipeline parallel across nodes: `--nnodes`,
  `--node-rank`, `--master-addr`, `--master-port`, non-leaders `--headless` (vLLM >= 0.11.1: v0.11.0
  needs Ray for it, so such a pool needs spec.engine.image at v0.11.1 or later).
- SGLang: `--nnodes`, `--node-rank`, `--dist-init-addr leader:port`; only node rank 0 serves HTTP.
- Wide expert parallel picks the MoE all-to-all kernel by role: throughput for prefill, latency for decode
  (SGLang: flags here; vLLM v0.11: the VLLM_ALL2ALL_BACKEND environment, see podneeds).
The start rank needs arithmetic at run time, so a multi-node container runs `/bin/sh -c 'exec ...'`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Final, Literal

from xpyd_api import labels as L
from xpyd_api.layout import ReplicaLayout

Rank = Literal["leader", "worker"]
LEADER_ADDRESS: Final = "${" + L.ENV_LWS_LEADER_ADDRESS + "}"
WORKER_INDEX: Final = "${" + L.ENV_LWS_WORKER_INDEX + ":-0}"
SGLANG_DEEPEP_MODE: Final = {"prefill": "normal", "decode": "low_latency"}
VLLM_MULTI_NODE_TP: Final = (0, 11, 1)  # the first vLLM with --nnodes/--node-rank/--master-addr (no Ray)
_TAG = re.compile(r":v?(\d+)\.(\d+)\.(\d+)(?:[-+.].*)?$")


def vllm_too_old_for_tp_across_nodes(image: str, layout: ReplicaLayout) -> str | None:
    """Why `image` cannot run this layout's tensor/pipeline parallel across nodes, or None.

    Only a tag that names a version is judged (vllm/vllm-openai:v0.11.0); a digest or a custom tag passes.
    """
    if not layout.multi_node or layout.dp > 1:
        return None
    found = _TAG.search(image)
    if found is None or tuple(int(g) for g in found.groups()) >= VLLM_MULTI_NODE_TP:
        return None
    need = ".".join(map(str, VLLM_MULTI_NODE_TP))
    return (
        f"{image} runs tensor/pipeline parallel across nodes only with Ray; vLLM v{need} added --nnodes/--node-rank: "
        f"set spec.engine.image to v{need} or later, or use data parallel (dataParallelSize) across the nodes"
    )


@dataclass(frozen=True, slots=True)
class Raw:
    """A shell word that must reach the shell unquoted (it expands a variable or does arithmetic)."""

    text: str


Word = str | Raw


def vllm_flags(layout: ReplicaLayout, rank: Rank) -> list[Word]:
    """vLLM's flags for one rank of a multi-node replica (appended to the pool's usual command line)."""
    out: list[Word]
    if layout.dp > 1:
        out = ["--data-parallel-size-local", str(layout.dp_local), "--data-parallel-address", Raw(LEADER_ADDRESS)]
        out += ["--data-parallel-rpc-port", str(L.DP_RPC_PORT)]
        if rank == "worker":
            start = Raw(f"$(( {WORKER_INDEX} * {layout.dp_local} ))")
            out += ["--headless", "--data-parallel-start-rank", start]
    else:
        out = ["--nnodes", str(layout.pods), "--node-rank", Raw(WORKER_INDEX), "--master-addr", Raw(LEADER_ADDRESS)]
        out += ["--master-port", str(L.DP_RPC_PORT)]
        if rank == "worker":
            out.append("--headless")
    return out


def sglang_flags(layout: ReplicaLayout, role: str) -> list[Word]:
    """SGLang's flags for one rank: the node count, this node's rank and the leader's init address."""
    out: list[Word] = ["--nnodes", str(layout.pods), "--node-rank", Raw(WORKER_INDEX)]
    out += ["--dist-init-addr", Raw(f"{LEADER_ADDRESS}:{L.SGLANG_DIST_PORT}")]
    if layout.expert_parallel and role in SGLANG_DEEPEP_MODE:
        out += ["--moe-a2a-backend", "deepep", "--deepep-mode", SGLANG_DEEPEP_MODE[role]]
    return out


def shell(argv: list[Word]) -> list[str]:
    """`/bin/sh -c 'exec argv'`, every literal word quoted, every Raw word left for the shell to expand."""
    words = [w.text if isinstance(w, Raw) else shlex.quote(w) for w in argv]
    return ["/bin/sh", "-c", "exec " + " ".join(words)]
