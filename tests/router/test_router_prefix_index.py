"""The approximate prefix index: hits, LRU eviction that keeps prefixes, worker removal."""

from __future__ import annotations

import pytest

from xpyd_router.prefix_index import PrefixIndex


def test_match_counts_leading_blocks_per_worker() -> None:
    index = PrefixIndex()
    index.record("a", [1, 2, 3, 4])
    index.record("b", [1, 2])
    index.record("c", [9])
    assert index.match([1, 2, 3, 4, 5]) == {"a": 4, "b": 2}
    assert index.match([1, 2, 7]) == {"a": 2, "b": 2}
    assert index.match([9, 1]) == {"c": 1}
    assert index.match([]) == {}
    assert index.match([1, 2, 3], among=["b", "zzz"]) == {"b": 2}


def test_lru_evicts_the_tail_of_old_prompts_first() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 4)
    index.record("a", [1, 2, 3])
    index.record("a", [10, 11, 12])
    assert index.blocks_of("a") == 4
    assert index.match([1, 2, 3]) == {"a": 1}  # block 1 kept (head), 2 and 3 evicted
    assert index.match([10, 11, 12]) == {"a": 3}


def test_touching_a_block_keeps_it() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 3)
    index.record("a", [1, 2])
    index.record("a", [5])
    index.record("a", [1])
    index.record("a", [6])
    # 2 was the least recently used; 1 survived because it was touched after 5 arrived.
    assert index.match([1, 2]) == {"a": 1}
    assert index.match([5]) == {"a": 1}
    assert index.match([6]) == {"a": 1}


def test_shrinking_capacity_and_removal() -> None:
    index = PrefixIndex()
    index.record("a", list(range(100)))
    index.record("b", list(range(50)))
    assert len(index) == 150
    index.set_capacity("a", 10)
    assert index.blocks_of("a") == 10
    index.remove_worker("b")
    assert index.match(list(range(100))) == {"a": 10}
    assert index.workers == ["a"]
    index.remove_worker("b")  # unknown: no-op
    index.record("c", [0])  # the freed bit is reused
    assert index.match([0]) == {"a": 1, "c": 1}


def test_bad_capacity_is_named() -> None:
    with pytest.raises(ValueError, match="capacity of 'a'"):
        PrefixIndex().set_capacity("a", 0)
