"""Cheap deterministic tokenization (4 characters per token), chained block hashes and filler text.

The emulator never needs real token ids: a token is 4 characters of the prompt text (or one id
of a token-id prompt), a KV block is `block_size` consecutive tokens, and a block's hash chains
the previous block's hash with the block's own text, as vLLM's prefix cache does with token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

CHARS_PER_TOKEN = 4
_FILLER_WORDS = (" the", " cat", " sat", " on ", "the ", "mat.")
_FILLER = "".join(_FILLER_WORDS) * 64


def count_tokens(text: str) -> int:
    """Tokens in a text: one per started group of 4 characters."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def block_hashes_text(text: str, block_size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the full `block_size`-token blocks of a text prompt (at most `limit`)."""
    width = block_size * CHARS_PER_TOKEN
    full = len(text) // width
    if limit is not None:
        full = min(full, limit)
    hashes = []
    h = 0
    for i in range(full):
        h = hash((h, text[i * width : (i + 1) * width]))
        hashes.append(h)
    return hashes


def block_hashes_ids(ids: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the full blocks of a token-id prompt."""
    full = len(ids) // block_size
    if limit is not None:
        full = min(full, limit)
    hashes = []
    h = 0
    for i in range(full):
        h = hash((h, tuple(ids[i * block_size : (i + 1) * block_size])))
        hashes.append(h)
    return hashes


def filler(start: int, count: int) -> str:
    """The text of generated tokens start..start+count-1 (each exactly 4 characters)."""
    global _FILLER
    end = (start + count) * CHARS_PER_TOKEN
    while len(_FILLER) < end:
        _FILLER = _FILLER + _FILLER
    return _FILLER[start * CHARS_PER_TOKEN : end]


def render_chat(messages: list[dict[str, object]]) -> str:
    """A ChatML-like prompt text for chat messages (already validated: role and text content)."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)
