"""Which data-parallel rank of a vLLM replica serves a request: the header's, else the least loaded.

vLLM's OpenAI server reads `X-data-parallel-rank` (entrypoints/openai/serving_engine.py
`_get_data_parallel_rank`): the header as a Python int, a value that is not one ignored. The
processor refuses a rank outside [0, D) with a ValueError the handlers answer as a 400
BadRequestError (v1/engine/processor.py `process_inputs`). Without a rank the internal load
balancer (v1/engine/core_client.py `DPLBAsyncMPClient.get_core_engine_for_request`) scores each
engine `waiting * 4 + running` and takes the first lowest, scanning from engine 0.

vLLM 0.11.0 does not read the header; 0.11.1 to 0.13 read it but drop it before the engine client
(serving_engine `_process_inputs` builds the EngineCoreRequest without it); 0.14.0 passes it on. The
emulator honours it, as 0.14 does (the operator routes to ranks only where the engine would).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xpyd_emulator.errors import ApiError

HEADER = "X-data-parallel-rank"


def header_rank(headers: Mapping[str, str]) -> int | None:
    """The rank a request names in its header (`headers`' names in lower case, as xpyd_http reads them),
    or None (absent or not an integer: vLLM ignores it)."""
    text = headers.get(HEADER.lower())
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def check_rank(rank: int, ranks: int) -> int:
    """`rank` when it is one of the replica's; else vLLM's 400."""
    if not 0 <= rank < ranks:
        raise ApiError(f"data_parallel_rank {rank} is out of range [0, {ranks}).")
    return rank


def least_loaded(waiting: Sequence[int], running: Sequence[int]) -> int:
    """vLLM's internal load balancing: the first rank with the lowest waiting * 4 + running."""
    best, best_score = 0, -1
    for rank, (w, r) in enumerate(zip(waiting, running, strict=True)):
        score = w * 4 + r
        if best_score < 0 or score < best_score:
            best, best_score = rank, score
    return best
