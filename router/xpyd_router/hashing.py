"""Cheap, deterministic prompt-block hashes and rendezvous hashing shared by every router replica."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

DEFAULT_BLOCK_CHARS = 256
_MASK = (1 << 64) - 1
_MAX_BLOCKS = 1 << 16
_RNG = np.random.default_rng(0x5EED_C0DE)
_WORD_KEYS = _RNG.integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)
_POS_KEYS = _RNG.integers(1, 2**63, size=_MAX_BLOCKS, dtype=np.uint64) | np.uint64(1)


def block_hashes(text: str, block_chars: int = DEFAULT_BLOCK_CHARS) -> list[int]:
    """Chained 64-bit hashes of the prompt's full blocks: entry k depends on blocks 0..k and their order.

    Blocks are cut on UTF-8 bytes (`block_chars` bytes, a multiple of 8), the cheap stand-in for
    token blocks: the same text always gives the same hashes, in every process (no PYTHONHASHSEED).
    """
    if block_chars <= 0 or block_chars % 8 or block_chars // 8 > len(_WORD_KEYS):
        raise ValueError(f"block_chars must be a positive multiple of 8 up to 32768, got {block_chars}")
    data = text.encode("utf-8", "surrogatepass")
    n = min(len(data) // block_chars, _MAX_BLOCKS)
    if n == 0:
        return []
    words = np.frombuffer(data, dtype=np.uint64, count=n * block_chars // 8).reshape(n, block_chars // 8)
    with np.errstate(over="ignore"):
        mixed = words * _WORD_KEYS[: block_chars // 8]
        mixed ^= mixed >> np.uint64(29)
        per_block = mixed.sum(axis=1, dtype=np.uint64)
        per_block *= _POS_KEYS[:n]
        per_block ^= per_block >> np.uint64(31)
        chained = np.cumsum(per_block, dtype=np.uint64)
    result: list[int] = chained.tolist()
    return result


def text_key(text: str) -> int:
    """A stable key for prompts too short to have a full block."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass")[:DEFAULT_BLOCK_CHARS])


def mix64(value: int) -> int:
    """splitmix64 finalizer: spreads a 64-bit value over all bits."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


@lru_cache(maxsize=4096)
def worker_key(name: str) -> int:
    """A stable 64-bit key for a worker name (its URL or pod name); memoized, the names are few."""
    raw = name.encode()
    return (zlib.crc32(raw) << 32) | zlib.adler32(raw)


def rendezvous(key: int, candidates: Sequence[str]) -> str:
    """Highest-random-weight choice: every replica picks the same candidate for the same key."""
    if not candidates:
        raise ValueError("rendezvous needs at least one candidate")
    return max(candidates, key=lambda name: mix64(key ^ worker_key(name)))


def weight(key: int, name: str) -> int:
    """The rendezvous weight of a worker for a key: ranking workers by it gives every replica the
    same order of homes for that key (the first is `rendezvous`'s choice)."""
    return mix64(key ^ worker_key(name))


AFFINITY_BLOCKS = 32  # 8 KiB of text at the default block size: past typical shared system prompts


def affinity_key(blocks: Sequence[int], text: str, leading: int = AFFINITY_BLOCKS) -> int:
    """The tie-break key of a request: its leading prefix blocks, so shared prefixes share a worker.

    Long enough to reach past a system prompt that every request shares (else all cold requests
    would tie on the same key and pile onto one worker), short enough that a conversation's later
    turns, which extend the same prefix, keep the key of its first turn.
    """
    if blocks:
        return blocks[min(leading, len(blocks)) - 1]
    return text_key(text)
