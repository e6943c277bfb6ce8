"""Deterministic prompt text for trace requests: shared prefix blocks become identical text."""

from __future__ import annotations

from xpyd_sim.trace import MOONCAKE_BLOCK_TOKENS as BLOCK_TOKENS
from xpyd_sim.trace import TraceRequest

CHARS_PER_TOKEN = 4  # the emulator's tokenizer: one token per 4 characters
_WORDS = ("alpha ", "bravo ", "delta ", "gamma ", "kappa ", "omega ", "sigma ", "theta ")


def block_text(block_id: int, tokens: int = BLOCK_TOKENS) -> str:
    """The text of one prefix block: the same id always gives the same characters."""
    width = tokens * CHARS_PER_TOKEN
    head = f"<{block_id:x}> "
    body: list[str] = []
    size = len(head)
    x = block_id * 2654435761 % 2**32 or 1
    while size < width:
        x = (x * 1103515245 + 12345) % 2**31
        word = _WORDS[x % len(_WORDS)]
        body.append(word)
        size += len(word)
    return (head + "".join(body))[:width]


def prompt_text(request: TraceRequest, scale: float = 1.0) -> str:
    """A prompt of about request.prompt_tokens * scale tokens built from its prefix blocks."""
    want = max(1, int(request.prompt_tokens * scale)) * CHARS_PER_TOKEN
    parts: list[str] = []
    size = 0
    for block in request.blocks:
        if size >= want:
            break
        text = block_text(block)
        parts.append(text)
        size += len(text)
    text = "".join(parts)
    if len(text) < want:
        tail = (int(request.arrival * 1000) * 31 + request.prompt_tokens) & 0xFFFFFFFF
        while len(text) < want:
            text += block_text(tail)[: want - len(text)]
            tail += 1
    return text[:want]
