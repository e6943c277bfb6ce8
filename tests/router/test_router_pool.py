"""The worker pool: level-based membership, draining, failure marking, capacity from metrics."""

from __future__ import annotations

import pytest

from xpyd_router.model import NoWorker, RouteRequest
from xpyd_router.policies import KvAwareConfig, KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec, parse_worker_arg
from xpyd_router.scrape import WorkerMetrics

P1, P2, D1 = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
REQ = RouteRequest(list(range(50)), key=1)


def pool() -> WorkerPool:
    p = WorkerPool(KvAwarePolicy(KvAwareConfig(direct_below_blocks=0)), block_chars=256)
    p.set_workers([WorkerSpec(P1, "prefill", "n1"), WorkerSpec(P2, "prefill", "n2"), WorkerSpec(D1, "decode")])
    return p


def test_removed_worker_gets_nothing_new_and_leaves_when_idle() -> None:
    p = pool()
    p.begin(P1)
    p.set_workers([WorkerSpec(P2, "prefill"), WorkerSpec(D1, "decode")])
    assert P1 in p.workers
    assert p.workers[P1].draining
    assert all(p.route(REQ).prefill.worker == P2 for _ in range(5))  # type: ignore[union-attr]
    p.end(P1)
    assert P1 not in p.workers
    assert P1 not in p.index.workers


def test_a_worker_coming_back_is_undrained() -> None:
    p = pool()
    p.begin(P1)
    p.set_workers([WorkerSpec(D1, "decode")])
    p.set_workers([WorkerSpec(P1, "prefill", "n9"), WorkerSpec(D1, "decode")])
    assert not p.workers[P1].draining
    assert p.workers[P1].domain == "n9"


def test_failed_worker_is_skipped_until_metrics_answer() -> None:
    p = pool()
    p.mark_failed(P1)
    assert p.route(REQ).prefill.worker == P2  # type: ignore[union-attr]
    p.apply_metrics(P1, WorkerMetrics(waiting=0, running=0, kv_usage=0.1, block_size=16, num_gpu_blocks=64))
    assert p.workers[P1].healthy
    assert p.workers[P1].capacity_blocks == 16 * 64 * 4 // 256
    p.apply_metrics(P1, None)
    assert not p.workers[P1].healthy


def test_exclusions_and_no_worker() -> None:
    p = pool()
    assert p.route(REQ, frozenset({P1})).prefill.worker == P2  # type: ignore[union-attr]
    with pytest.raises(NoWorker, match="decode"):
        p.route(REQ, frozenset({D1}))


@pytest.mark.parametrize(
    ("raw", "spec"),
    [
        ("http://127.0.0.1:8100", WorkerSpec("http://127.0.0.1:8100", "decode")),
        ("http://127.0.0.1:8100/@node-a", WorkerSpec("http://127.0.0.1:8100", "decode", "node-a")),
    ],
)
def test_parse_worker_arg(raw: str, spec: WorkerSpec) -> None:
    assert parse_worker_arg(raw, "decode") == spec


@pytest.mark.parametrize("raw", ["127.0.0.1:8100", "http://", "ftp://x"])
def test_bad_worker_arg_is_named(raw: str) -> None:
    with pytest.raises(ValueError, match="worker URL must look like"):
        parse_worker_arg(raw, "decode")
