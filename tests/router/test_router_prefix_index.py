"""The approximate prefix index: hits, LRU eviction that keeps prefixes, worker removal."""

from __future__ import annotations

import pytest

from xpyd_router.kv.prefix_index import PrefixIndex


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


def test_an_engine_store_of_recorded_blocks_keeps_the_prompt_head_newest() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 4)
    index.record("a", [1, 2, 3])  # routed: head 1 newest, tail 3 oldest
    index.confirm("a", [2, 3])  # the engine computed the tail: no move
    index.record("a", [10, 11])  # makes room: the tail goes first, as the engine frees it
    assert index.match([1, 2, 3]) == {"a": 2}
    index.confirm("a", [20])  # a block the router never recorded enters as newest
    assert index.match([20]) == {"a": 1} and index.blocks_of("a") == 4


def test_store_would_have_evicted_the_prefix() -> None:
    """The contrast confirm exists for: moving the computed tail above the reused head."""
    index = PrefixIndex()
    index.set_capacity("a", 4)
    index.record("a", [1, 2, 3])
    index.store("a", [2, 3])
    index.record("a", [10, 11])
    assert index.match([1, 2, 3]) == {}


def test_recent_counts_new_blocks_a_share_of_reused_ones_and_unrouted_engine_stores() -> None:
    index = PrefixIndex()
    for name in ("a", "b"):
        index.set_capacity(name, 1000)
    index.record("a", list(range(10)))
    index.record("b", list(range(100, 115)))
    assert index.recent("b") > index.recent("a") > 0
    index.record("a", list(range(10)))  # a prompt reusing what a holds counts a quarter (REUSED_WEIGHT)...
    assert index.recent("b") > index.recent("a")  # 12.5 < 15
    index.record("a", list(range(10)))
    index.record("a", list(range(10)))  # ...and adds up: 17.5 > 15
    assert index.recent("a") > index.recent("b")
    before = index.recent("a")
    index.confirm("a", list(range(10)))  # the engine stored what the router sent: counted once
    assert index.recent("a") == before
    index.confirm("b", list(range(200, 230)))  # blocks no route here told of
    assert index.recent("b") > index.recent("a")


def test_recent_forgets_the_past() -> None:
    """Two caches of 10 blocks: the pool's half-life is 20 blocks taken, so 15 blocks taken now
    outweigh 20 taken a half-life ago (a cumulative count would rank them the other way)."""
    index = PrefixIndex()
    for name in ("a", "b"):
        index.set_capacity(name, 10)
    index.record("a", list(range(20)))
    index.record("b", list(range(100, 115)))
    assert index.recent("b") > index.recent("a")


def test_recent_of_a_newcomer_starts_level_with_the_least() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 100)
    index.record("a", list(range(30)))
    index.record("b", list(range(100, 110)))  # joins level with a, then takes 10 more
    assert index.recent("b") > index.recent("a")
    index.set_capacity("c", 100)
    assert index.recent("c") == index.recent("a") < index.recent("b")
    index.remove_worker("b")
    assert index.recent("b") == 0.0


def test_recent_stays_finite_and_ordered_over_a_long_run() -> None:
    index = PrefixIndex()
    for name in ("a", "b"):
        index.set_capacity(name, 1)
    block = 0
    for _ in range(500):  # far past the rescale point (2 blocks per half-life)
        index.record("a", [block])
        index.record("b", [block + 1, block + 2])
        block += 3
    a, b = index.recent("a"), index.recent("b")
    assert 0 < a < b < 2.0**62
    assert b / a == pytest.approx(4.0)  # twice the blocks, each round half a half-life later than a's
