"""The prefix index's three writers, named in every entry: this replica's routes (`own`), a peer's
(`peer`), the engine's KV events (`engine`); the engine's word is final, and naming changes nothing else."""

from __future__ import annotations

import random

from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.loadshare import LoadShare, worker_id
from xpyd_router.model import RouteRequest
from xpyd_router.policy.registry import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def test_each_writer_names_its_entries() -> None:
    index = PrefixIndex()
    index.record("w", [1, 2, 3])
    index.record_peer("w", [4, 5])
    index.confirm("w", [6])
    assert [index.source("w", b) for b in range(1, 8)] == ["own"] * 3 + ["peer"] * 2 + ["engine", None]
    assert index.sources("w") == {"own": 3, "peer": 2, "engine": 1}
    assert index.sources("nobody") == {"own": 0, "peer": 0, "engine": 0}


def test_the_engine_settles_a_guess_and_no_guess_overrides_it() -> None:
    index = PrefixIndex()
    index.record_peer("w", [1, 2])
    index.record("w", [2, 3])  # the latest guess names a guessed block
    assert (index.source("w", 1), index.source("w", 2), index.source("w", 3)) == ("peer", "own", "own")
    index.confirm("w", [1, 2, 3, 4])
    assert index.sources("w") == {"own": 0, "peer": 0, "engine": 4}
    index.record("w", [1, 5])
    index.record_peer("w", [2])
    assert (index.source("w", 1), index.source("w", 2), index.source("w", 5)) == ("engine", "engine", "own")
    index.discard("w", [1, 5])
    assert index.sources() == {"own": 0, "peer": 0, "engine": 3}


def test_confirming_a_guess_keeps_its_place_in_the_lru() -> None:
    index = PrefixIndex()
    index.set_capacity("w", 3)
    index.record("w", [1, 2, 3])  # head first: 3 is the oldest, then 2, then 1
    index.confirm("w", [3])  # a fact now, still where it was
    index.record("w", [7, 8])  # evicts the two oldest: 3 and 2
    assert [index.source("w", b) for b in (1, 2, 3, 7, 8)] == ["own", None, None, "own", "own"]


def test_naming_the_writers_changes_nothing_else() -> None:
    """A random run of writes, removals and capacity changes: what the index matches and each worker's
    recent intake are the same whichever replica's route a guess came from."""
    rng = random.Random(3)
    named, plain = PrefixIndex(), PrefixIndex()
    workers = ["a", "b", "c"]
    for _ in range(3000):
        w = rng.choice(workers)
        start = rng.randrange(40)
        blocks = list(range(start, start + rng.randrange(1, 12)))
        op = rng.random()
        if op < 0.35:
            named.record(w, blocks)
            plain.record(w, blocks)
        elif op < 0.6:
            named.record_peer(w, blocks)  # a peer's route...
            plain.record(w, blocks)  # ...recorded as an own one
        elif op < 0.85:
            named.confirm(w, blocks)
            plain.confirm(w, blocks)
        elif op < 0.95:
            named.discard(w, blocks)
            plain.discard(w, blocks)
        else:
            cap = rng.randrange(4, 30)
            named.set_capacity(w, cap)
            plain.set_capacity(w, cap)
        probe = list(range(rng.randrange(40), 45))
        assert named.match(probe) == plain.match(probe)
    assert [named.recent(w) for w in workers] == [plain.recent(w) for w in workers]
    assert sum(named.sources().values()) == len(named) == len(plain)


def test_a_peers_routes_enter_as_peer_guesses_and_own_routes_as_own() -> None:
    pool = WorkerPool(KvAwarePolicy(), block_chars=256)
    pool.set_workers([WorkerSpec(A, "worker"), WorkerSpec(B, "worker")])
    share = LoadShare(pool, ["http://127.0.0.1:9100"])
    share.learn([[[worker_id(A)], [10, 11, 12]]])
    assert pool.index.sources(A) == {"own": 0, "peer": 3, "engine": 0}
    chosen = pool.route(RouteRequest([20, 21], key=1)).decode.worker
    assert pool.index.sources(chosen)["own"] == 2
