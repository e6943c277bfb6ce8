"""Prompt block hashes: deterministic, chained, cheap stand-ins for token blocks."""

from __future__ import annotations

import pytest

from xpyd_router.hashing import affinity_key, block_hashes, rendezvous, text_key


def test_full_blocks_only_and_prefix_shared() -> None:
    a = block_hashes("x" * 1000, 256)
    b = block_hashes("x" * 768 + "y" * 300, 256)
    assert len(a) == 3  # 1000 // 256: the partial tail block is not hashed
    assert a == b[:3]
    assert block_hashes("x" * 255, 256) == []


def test_chaining_makes_later_blocks_depend_on_earlier_ones() -> None:
    a = block_hashes("A" * 256 + "C" * 256, 256)
    b = block_hashes("B" * 256 + "C" * 256, 256)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same second block, different prefix


def test_same_text_same_hashes_across_calls() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 100
    assert block_hashes(text) == block_hashes(text)
    assert len(set(block_hashes(text))) == len(block_hashes(text))


@pytest.mark.parametrize("size", [0, -8, 12, 8 * 4097])
def test_bad_block_size_is_named(size: int) -> None:
    with pytest.raises(ValueError, match="block_chars"):
        block_hashes("abc", size)


def test_rendezvous_is_stable_and_spreads() -> None:
    workers = [f"http://127.0.0.1:{8100 + i}" for i in range(8)]
    picks = {rendezvous(key, workers) for key in range(200)}
    assert len(picks) == 8
    assert all(rendezvous(k, workers) == rendezvous(k, list(reversed(workers))) for k in range(50))
    # Removing a worker only moves the keys that it owned.
    moved = sum(rendezvous(k, workers) != rendezvous(k, workers[1:]) for k in range(200))
    owned = sum(rendezvous(k, workers) == workers[0] for k in range(200))
    assert moved == owned
    with pytest.raises(ValueError, match="candidate"):
        rendezvous(1, [])


def test_affinity_key_uses_leading_blocks() -> None:
    system = "s" * 2048  # shared by every request
    head = system + "conversation one " * 400
    a, b = block_hashes(head + "a" * 512), block_hashes(head + "b" * 512)
    assert affinity_key(a, "") == affinity_key(b, "")  # later turns keep the first turn's key
    other = block_hashes(system + "conversation two " * 400)
    assert affinity_key(other, "") != affinity_key(a, "")  # a shared system prompt is not the key
    short = block_hashes("x" * 600)
    assert affinity_key(short, "") == short[-1]
    assert affinity_key([], "short") == text_key("short")
