"""The router's pairable capacity per engine revision: what an engine change leaves to pair, counted."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from xpyd_router.health import publish, revisions
from xpyd_router.metrics import RouterMetrics
from xpyd_router.policy.kv import KvAwarePolicy
from xpyd_router.pool import WorkerPool, WorkerSpec


def pool_of(*workers: tuple[str, str, str]) -> WorkerPool:
    pool = WorkerPool(KvAwarePolicy(), 256)
    pool.set_workers(WorkerSpec(url, role, rev=rev) for url, role, rev in workers)  # type: ignore[arg-type]
    return pool


def gauges(metrics: RouterMetrics) -> dict[tuple[str, ...], float]:
    out = {}
    for name in ("xpyd_router_revision_workers", "xpyd_router_pairable_workers"):
        for family in metrics.registry.collect():
            for s in family.samples:
                if s.name == name:
                    out[(name, *s.labels.values())] = s.value
    return out


@pytest.mark.parametrize(
    ("workers", "by_rev", "pairable"),
    [
        ([("p0", "prefill", "a"), ("d0", "decode", "a"), ("d1", "decode", "a")], {"a": {"prefill": 1, "decode": 2}}, 1),
        # mid-roll: each revision pairs on its own
        (
            [("p0", "prefill", "a"), ("p1", "prefill", "b"), ("d0", "decode", "a"), ("d1", "decode", "b"),
             ("d2", "decode", "b")],
            {"a": {"prefill": 1, "decode": 1}, "b": {"prefill": 1, "decode": 2}},
            2,
        ),
        # decode rolled, prefill not: ready workers in both roles, yet nothing to pair
        ([("p0", "prefill", "a"), ("d0", "decode", "b")], {"a": {"prefill": 1, "decode": 0},
                                                          "b": {"prefill": 0, "decode": 1}}, 0),
        ([("w0", "worker", "a")], {}, 0),  # co-located: no pairs at all
    ],
)  # fmt: skip
def test_ready_workers_per_revision_and_the_pairable_capacity(
    workers: list[tuple[str, str, str]], by_rev: dict[str, dict[str, int]], pairable: int
) -> None:
    pool = pool_of(*workers)
    assert revisions(pool) == by_rev
    metrics = RouterMetrics("dd", CollectorRegistry())
    publish(pool, metrics)
    got = gauges(metrics)
    assert got[("xpyd_router_pairable_workers", "dd")] == pairable
    for rev, roles in by_rev.items():
        for role, n in roles.items():
            assert got[("xpyd_router_revision_workers", "dd", rev, role)] == n


def test_a_revision_no_worker_runs_any_more_leaves_the_series() -> None:
    pool = pool_of(("p0", "prefill", "a"), ("d0", "decode", "a"))
    metrics = RouterMetrics("dd", CollectorRegistry())
    publish(pool, metrics)
    pool.set_workers([WorkerSpec("p1", "prefill", rev="b"), WorkerSpec("d1", "decode", rev="b")])
    for name in ("p0", "d0"):  # drained and idle: gone
        pool.workers.pop(name, None)
    pool.workers["p1"].healthy = pool.workers["d1"].healthy = True
    publish(pool, metrics)
    revs = {k[2] for k in gauges(metrics) if k[0] == "xpyd_router_revision_workers"}
    assert revs == {"b"}
    assert gauges(metrics)[("xpyd_router_pairable_workers", "dd")] == 1


def test_an_unhealthy_or_draining_worker_does_not_count() -> None:
    pool = pool_of(("p0", "prefill", "a"), ("d0", "decode", "a"), ("d1", "decode", "a"))
    pool.workers["d0"].healthy = False
    pool.workers["d1"].draining = True
    assert revisions(pool) == {"a": {"prefill": 1, "decode": 0}}
