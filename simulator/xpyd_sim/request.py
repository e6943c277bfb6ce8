"""The simulator's per-request record: what happened to one trace request and when."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xpyd_sim.worker import Worker


class SimRequest:
    """Mutable timeline of one request; times are simulated seconds, -1.0 when not reached."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached_tokens",
        "decode_rank",
        "decode_worker",
        "direct",
        "finish_step",
        "finished",
        "first_token",
        "handoff_bytes",
        "handoff_path",
        "kv_reserved",
        "output_tokens",
        "prefill_done",
        "prefill_end",
        "prefill_rank",
        "prefill_start",
        "prefill_worker",
        "prompt_tokens",
        "ready",
        "reloaded_tokens",
        "rid",
    )

    def __init__(
        self, rid: int, arrival: float, prompt_tokens: int, output_tokens: int, blocks: tuple[int, ...]
    ) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt_tokens = max(1, prompt_tokens)
        self.output_tokens = max(1, output_tokens)
        self.blocks = blocks
        self.prefill_worker: Worker | None = None
        self.decode_worker: Worker | None = None
        self.direct = False
        # the data-parallel rank of each hop's replica: pinned by the router (rank targets), else -1
        # until the replica's API server picks one (vLLM's load balancing); 0 on a replica of one rank
        self.prefill_rank = -1
        self.decode_rank = -1
        self.cached_tokens = 0  # prompt tokens it did not compute: hit on the GPU, or reloaded from the CPU tier
        self.reloaded_tokens = 0  # of those, the ones reloaded from the CPU tier
        self.ready = -1.0  # when its reload from the CPU tier is done (its prefill waits until then)
        self.prefill_done = 0  # prompt tokens in the KV cache so far (cached + computed)
        self.prefill_start = -1.0
        self.prefill_end = -1.0
        self.first_token = -1.0
        self.finished = -1.0
        self.finish_step = 0
        self.kv_reserved = 0
        self.handoff_path = ""
        self.handoff_bytes = 0

    def __repr__(self) -> str:
        return f"SimRequest(rid={self.rid}, arrival={self.arrival:.3f}, prompt={self.prompt_tokens})"
