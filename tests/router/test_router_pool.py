"""The worker pool: level-based membership, draining, failure marking, capacity from metrics."""

from __future__ import annotations

import pytest

from xpyd_router.model import NoWorker, RouteRequest
from xpyd_router.policy.registry import KvAwareConfig, KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec, parse_worker_arg
from xpyd_router.scrape import WorkerMetrics

P1, P2, D1, P3 = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"
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
    p.mark_down(P1)
    assert p.route(REQ).prefill.worker == P2  # type: ignore[union-attr]
    p.apply_metrics(P1, WorkerMetrics(waiting=0, running=0, kv_usage=0.1, block_size=16, num_gpu_blocks=64))
    assert p.workers[P1].healthy
    assert p.workers[P1].capacity_blocks == 16 * 64 * 4 // 256
    p.apply_metrics(P1, None)
    assert not p.workers[P1].healthy


@pytest.mark.parametrize(
    ("outcomes", "healthy"),
    [
        (["slow"], True),  # a busy engine answers /metrics late: one timeout is no outage
        (["slow", "slow"], True),
        (["slow", "slow", "slow"], False),  # three in a row are
        (["slow", "slow", "ok", "slow", "slow"], True),  # an answer starts the count again
        (["refused"], False),  # a refused connection or an error status takes it out at once
        (["slow", "refused"], False),
    ],
)
def test_slow_scrapes_take_a_worker_out_only_in_a_row(outcomes: list[str], healthy: bool) -> None:
    p = pool()
    for outcome in outcomes:
        if outcome == "ok":
            p.apply_metrics(P1, WorkerMetrics())
        else:
            p.apply_metrics(P1, None, timed_out=outcome == "slow")
    assert p.workers[P1].healthy is healthy


@pytest.mark.parametrize(
    ("others_down", "outcome", "healthy"),
    [
        ((), "slow", False),  # another decode-capable peer is ready: three slow scrapes take it out
        ((P2,), "slow", True),  # the last ready worker of its role stays: busy, not gone
        ((P2,), "refused", False),  # a refused scrape takes even the last one out
    ],
)
def test_slow_scrapes_never_take_out_the_last_ready_worker_of_a_role(
    others_down: tuple[str, ...], outcome: str, healthy: bool
) -> None:
    p = pool()
    for name in others_down:
        p.mark_down(name)
    for _ in range(5):
        p.apply_metrics(P1, None, timed_out=outcome == "slow")
    assert p.workers[P1].healthy is healthy
    assert p.workers[D1].healthy  # the other role is untouched


def test_the_last_decode_worker_keeps_serving_through_slow_scrapes() -> None:
    p = pool()
    for _ in range(5):
        p.apply_metrics(D1, None, timed_out=True)
    assert p.route(REQ).decode.worker == D1
    p.request_failed(D1)
    for _ in range(p.breaker_failures):
        p.request_failed(D1)
    with pytest.raises(NoWorker, match="decode"):  # a hung one is taken out by its requests
        p.route(REQ)


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


@pytest.mark.parametrize("raw", ["127.0.0.1:8100", "http://", "ftp://x", "http://h", "http://h:0x1", "http://h:1/p"])
def test_bad_worker_arg_is_named(raw: str) -> None:
    with pytest.raises(ValueError, match="worker URL must look like"):
        parse_worker_arg(raw, "decode")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_failed_request_is_counted_not_acted_on() -> None:
    p = pool()
    p.breaker_failures = 3
    assert not p.request_failed(P1)
    assert not p.request_failed(P1)
    p.request_ok(P1)  # a success in between: the count starts again
    assert not p.request_failed(P1)
    assert not p.request_failed(P1)
    assert p.workers[P1].healthy
    assert p.request_failed(P1)  # the third in a row trips the breaker
    assert not p.workers[P1].healthy


def test_a_tripped_breaker_holds_the_worker_out_until_its_hold_ends() -> None:
    p = pool()
    clock = p.clock = Clock()
    p.breaker_failures, p.breaker_hold = 1, 10.0
    assert p.request_failed(P1)
    p.apply_metrics(P1, WorkerMetrics())
    assert not p.workers[P1].healthy  # probes pass, but the hold is on
    assert p.held(P1)
    clock.now += 10.5
    p.apply_metrics(P1, WorkerMetrics())
    assert p.workers[P1].healthy
    assert p.workers[P1].failures == 0


def test_new_workers_wait_for_their_probe_when_the_service_asks() -> None:
    p = pool()
    probed: list[str] = []
    p.on_added = probed.append
    p.set_workers(
        [WorkerSpec(P1, "prefill"), WorkerSpec(P2, "prefill"), WorkerSpec(D1, "decode"), WorkerSpec(P3, "decode")]
    )
    assert probed == [P3]  # only the new one
    assert not p.workers[P3].healthy
    assert p.workers[P1].healthy
