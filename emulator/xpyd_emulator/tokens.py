"""Cheap deterministic tokenization (4 characters per token), chained block hashes and filler text.

The emulator has no real tokenizer: a token is 4 characters of the prompt text (or one id of a
token-id prompt) and its id is a fixed mix of those 4 code points below VOCAB, so the same text
gives the same ids in every process (the router computes them too, to line its block keys up
with the engine's blocks). A KV block is `block_size` consecutive tokens; its hash chains the
previous block's hash with the block's token ids, as vLLM's prefix cache does. The chain's seed
is random per process unless PYTHONHASHSEED is set, as vLLM's NONE_HASH is.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

import numpy as np

from xpyd_perf.emutokens import CHARS_PER_TOKEN as CHARS_PER_TOKEN  # the engine tokenizer, re-exported
from xpyd_perf.emutokens import VOCAB as VOCAB
from xpyd_perf.emutokens import Ids as Ids
from xpyd_perf.emutokens import count_tokens as count_tokens
from xpyd_perf.emutokens import token_ids as token_ids

MASK64 = (1 << 64) - 1
_FILLER_WORDS = (" the", " cat", " sat", " on ", "the ", "mat.")
_FILLER = "".join(_FILLER_WORDS) * 64
_SLOT_KEYS = np.random.default_rng(0xB10C).integers(1, 2**63, size=1024, dtype=np.uint64) | np.uint64(1)
_SEED_TEXT = os.environ.get("PYTHONHASHSEED")
NONE_HASH = hash(("xpyd-none-hash", int(_SEED_TEXT))) & MASK64 if _SEED_TEXT else random.getrandbits(64)


def salted_seed(salt: str) -> int:
    """The chain seed of a request with a `cache_salt`: its blocks are namespaced by the salt, as the
    engines' are (vLLM hashes it into the first block, SGLang into the namespace), so they never match
    another salt's or an unsalted prompt's."""
    return hash(("xpyd-cache-salt", NONE_HASH, salt)) & MASK64


def chain_hashes(ids: Ids, block_size: int, limit: int | None = None, seed: int = NONE_HASH) -> list[int]:
    """Chained 64-bit hashes of the full `block_size`-token blocks of `ids` (at most `limit`)."""
    full = len(ids) // block_size
    if limit is not None:
        full = min(full, limit)
    if full == 0:
        return []
    blocks = ids[: full * block_size].astype(np.uint64).reshape(full, block_size)
    with np.errstate(over="ignore"):
        mixed = blocks * _SLOT_KEYS[:block_size]
        mixed ^= mixed >> np.uint64(31)
        digests: list[int] = mixed.sum(axis=1, dtype=np.uint64).tolist()
    hashes = []
    h = seed
    for d in digests:
        h = hash((h, d)) & MASK64
        hashes.append(h)
    return hashes


def block_hashes_text(text: str, block_size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the full `block_size`-token blocks of a text prompt (at most `limit`)."""
    return chain_hashes(token_ids(text), block_size, limit)


def block_hashes_ids(ids: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the full blocks of a token-id prompt."""
    return chain_hashes(np.asarray(ids, dtype=np.int64), block_size, limit)


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
