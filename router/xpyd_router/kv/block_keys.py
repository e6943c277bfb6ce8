"""Prefix block keys the same in every router replica: over the engine's token blocks when the
router has the engine's tokenizer (so engine KV events land on them), else over prompt bytes.

A token block's key chains its parent's key with the block's ids and its depth in the prompt:
key(k) = key(k-1) + mix(ids of block k, k). The router computes a prompt's keys in one
vectorized pass, and the key of a block an engine reports stored from the parent's key and
depth, so both sides agree without the engine's own (per-process seeded) block hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xpyd_router.hashing import block_hashes
from xpyd_router.tokens.engine import Ids, Tokenizer

MAX_BLOCKS = 1 << 16  # deeper blocks are not keyed (1M tokens at 16 a block)
MAX_BLOCK_SIZE = 1024  # tokens: the largest block a key can be computed for
_RNG = np.random.default_rng(0x70CE_B10C)
_SLOT_KEYS = _RNG.integers(1, 2**63, size=MAX_BLOCK_SIZE, dtype=np.uint64) | np.uint64(1)
_DEPTH_KEYS = _RNG.integers(1, 2**63, size=MAX_BLOCKS, dtype=np.uint64) | np.uint64(1)


def token_block_keys(ids: Ids, block_size: int, parent: int = 0, depth: int = 0) -> list[int]:
    """Keys of the full `block_size`-token blocks of `ids`, the first at `depth`, chained onto `parent`."""
    if not 0 < block_size <= len(_SLOT_KEYS):
        raise ValueError(f"block size must be 1-{len(_SLOT_KEYS)} tokens, got {block_size}")
    n = min(len(ids) // block_size, MAX_BLOCKS - depth)
    if n <= 0:
        return []
    blocks = np.asarray(ids[: n * block_size]).astype(np.uint64).reshape(n, block_size)
    with np.errstate(over="ignore"):
        mixed = blocks * _SLOT_KEYS[:block_size]
        mixed ^= mixed >> np.uint64(29)
        per_block = mixed.sum(axis=1, dtype=np.uint64)
        per_block *= _DEPTH_KEYS[depth : depth + n]
        per_block ^= per_block >> np.uint64(31)
        chained = np.cumsum(per_block, dtype=np.uint64) + np.uint64(parent)
    keys: list[int] = chained.tolist()
    return keys


def salt_root(salt: object) -> int:
    """The key a salted prompt's first block chains onto (0 unsalted), as engines namespace a request's
    blocks by its `cache_salt`: a salted block never matches an unsalted prompt or another salt's."""
    if not isinstance(salt, str) or not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8, person=b"xpyd-salt").digest(), "big") | 1


def prompt_ids(body: Mapping[str, object]) -> list[int] | None:
    """A completion prompt given as token ids (`[ids]` or `[[ids]]`), else None: the text is tokenized."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 1 << 62 for t in prompt):
        return prompt
    return None


class RequestKeys:
    """How this router cuts prompts into block keys: engine token blocks, or bytes without a tokenizer."""

    def __init__(self, tokenizer: Tokenizer | None, block_size: int, block_chars: int, chars_per_token: float) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.block_chars = block_chars
        # Tokens one key stands for: sizes each worker's modelled cache from its reported capacity.
        self.tokens_per_block = float(block_size) if tokenizer is not None else block_chars / chars_per_token

    def set_block_size(self, block_size: int) -> None:
        """Key by the engines' block size (reported in their KV events)."""
        self.block_size = block_size
        if self.tokenizer is not None:
            self.tokens_per_block = float(block_size)

    @property
    def engine_aligned(self) -> bool:
        """Whether keys are the engine's blocks (engine KV events can then feed the index)."""
        return self.tokenizer is not None

    def __call__(self, text: str, prompt_ids: Sequence[int] | Ids | None = None, salt: object = None) -> list[int]:
        if self.tokenizer is None:
            return block_hashes(text, self.block_chars)
        ids = np.asarray(prompt_ids, dtype=np.int64) if prompt_ids is not None else self.tokenizer.encode(text)
        return token_block_keys(ids, self.block_size, salt_root(salt))

    def for_request(self, body: Mapping[str, Any], text: str, chat: bool) -> list[int]:
        """A parsed request's keys. `text` (protocol.parse_body's) keys it without a tokenizer; with one,
        completion token ids are used as sent, and the rest is tokenized as the engine does it (chat:
        rendered with the model's chat template, falling back to `text` when that cannot be done); a
        `cache_salt` keys them apart, as the engine's blocks of that salt are."""
        if self.tokenizer is None:  # no rendering, no tokenizing
            return self(text)
        ids = None if chat else prompt_ids(body)
        salt = body.get("cache_salt")
        return self(text, ids if ids is not None else self.tokenizer.prompt_ids(body, text, chat), salt)
