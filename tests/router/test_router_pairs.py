"""Prefill/decode pair health (xpyd_router.pairs): trips, cool-offs, recoveries on a fake clock; rerouting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import generate_latest
from stub_workers import call  # type: ignore[import-not-found]

from xpyd_router.cli import parser, validate
from xpyd_router.model import Decision, Plan, WorkerState
from xpyd_router.pairs import PairHealth, PairLimits, prompt_tokens, reroute
from xpyd_router.scrape import WorkerMetrics

pytestmark = pytest.mark.timeout(30)
P, D, D2 = "http://p:1", "http://d:1", "http://d:2"


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def health(**limits: float) -> tuple[PairHealth, Clock, list[tuple[str, str, float]]]:
    clock, seen = Clock(), []
    h = PairHealth(PairLimits(**limits), clock, lambda e, pair, why, s: seen.append((e, why, s)))  # type: ignore[arg-type]
    return h, clock, seen


# (steps, cooling after them): f = a failed handoff, o = one that worked, s = a slow one (2 s), t = 11 s pass
@pytest.mark.parametrize(
    ("steps", "cooling"),
    [
        ("", False),
        ("ff", False),
        ("fff", True),
        ("ffof", False),  # a good handoff resets the run
        ("ffft", False),  # the 10 s cool-off is over: back in pairing
        ("ffftf", True),  # on probation: one failure trips it again
        ("ffftof", False),  # a good handoff ends the probation
        ("sss", True),  # slow three times in a row
        ("ssos", False),
        ("sssts", True),  # slow again on probation
        ("ooo", False),
    ],
)
def test_trips_and_recoveries(steps: str, cooling: bool) -> None:
    h, clock, _ = health(failures=3, slow_seconds=1.0, slow=3, cool_off=10.0)
    for step in steps:
        if step == "f":
            h.failed(P, D)
        elif step == "o":
            h.ok(P, D, 0.01)
        elif step == "s":
            h.ok(P, D, 2.0)
        else:
            clock.now += 11
    assert h.cooling(P, D) is cooling
    assert not h.cooling(P, D2)  # only the pair, never its workers' other pairs


def test_cool_offs_double_up_to_the_cap_and_log_each_trip_and_recovery() -> None:
    h, clock, seen = health(failures=1, cool_off=10.0, max_cool_off=35.0)
    lengths = []
    for _ in range(4):
        h.failed(P, D)
        lengths.append(seen[-1][2])
        clock.now += seen[-1][2] + 0.001
        assert not h.cooling(P, D)
    assert lengths == [10.0, 20.0, 35.0, 35.0]
    assert [e for e, *_ in seen] == ["trip", "recover"] * 4
    h.ok(P, D, None)
    h.failed(P, D)
    assert seen[-1] == ("trip", "failures", 10.0)  # a good handoff reset the exponent


def test_latency_off_by_default_and_unseen_latency_never_slow() -> None:
    h, _, _ = health()
    for _ in range(10):
        h.ok(P, D, 60.0)
        h.ok(P, D, None)
    assert not h.cooling(P, D)
    assert not h._pairs  # healthy pairs hold no state


def test_failures_zero_never_trips_and_forget_drops_gone_workers() -> None:
    h, _, _ = health(failures=0)
    for _ in range(10):
        h.failed(P, D)
    assert not h.cooling(P, D)
    h.forget(lambda name: name != D)
    assert not h._pairs


def _worker(name: str, role: str = "decode", inflight: int = 0, rev: str = "", domain: str = "") -> WorkerState:
    return WorkerState(name=name, role=role, inflight=inflight, rev=rev, domain=domain)  # type: ignore[arg-type]


def test_reroute_picks_another_healthy_decode_of_the_same_revision_else_direct() -> None:
    h, _, _ = health(failures=1)
    plan = Plan(decode=Decision(D, "load"), prefill=Decision(P, "prefix", 3), kv_path="rdma")
    prefill = _worker(P, "prefill", rev="a", domain="n1")
    busy, idle, other_rev = (
        _worker(D2, inflight=5),
        _worker("http://d:3", rev="a", domain="n1"),
        _worker("http://d:4", rev="b"),
    )
    workers = {w.name: w for w in (prefill, busy, idle, other_rev, _worker(D))}
    ready = [workers[D], busy, idle, other_rev]
    assert reroute(plan, h, workers, ready) is plan  # healthy pair: untouched
    h.failed(P, D)
    moved = reroute(plan, h, workers, ready)
    assert moved.prefill == plan.prefill
    assert (moved.decode.worker, moved.decode.reason, moved.kv_path) == ("http://d:3", "pair_cooling", "nvlink")
    h.failed(P, "http://d:3")
    assert reroute(plan, h, workers, ready).decode.worker == D2  # the rest, least loaded first
    h.failed(P, D2)
    direct = reroute(plan, h, workers, ready)
    assert direct.prefill is None and direct.decode.worker == D and direct.decode.reason == "pair_cooling_direct"


def test_reroute_avoids_the_pairs_that_failed_this_request_while_still_in_pairing() -> None:
    h, _, _ = health(failures=3)
    plan = Plan(decode=Decision(D, "load"), prefill=Decision(P, "prefix", 3), kv_path="rdma")
    workers = {w.name: w for w in (_worker(P, "prefill"), _worker(D), _worker(D2, inflight=2))}
    ready = [workers[D], workers[D2]]
    assert reroute(plan, h, workers, ready, frozenset({(P, D2)})) is plan  # another pair failed: this one runs
    moved = reroute(plan, h, workers, ready, frozenset({(P, D)}))
    assert (moved.decode.worker, moved.decode.reason) == (D2, "pair_retry")
    direct = reroute(plan, h, workers, ready, frozenset({(P, D), (P, D2)}))
    assert direct.prefill is None and (direct.decode.worker, direct.decode.reason) == (D, "pair_retry_direct")


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        (b'{"choices":[],"usage":{"prompt_tokens":1234,"total_tokens":1235}}', 1234),
        (b'{"usage": {"prompt_tokens": 7}}', 7),
        (b'{"choices":[]}', 0),
        (b'{"usage":{"prompt_tokens":null}}', 0),
    ],
)
def test_prompt_tokens_read_off_the_reply(body: bytes, tokens: int) -> None:
    assert prompt_tokens(body) == tokens


# --- through the router: stub workers on 127.0.0.1 ---

FAST = {"connect_timeout": 0.5, "first_byte_timeout": 0.5, "idle_timeout": 0.3, "request_timeout": 5.0}


async def test_a_streamed_handoff_is_timed_and_its_bytes_counted_per_pair(stubs: Any, router: Any) -> None:
    prefill, decode = await stubs("prefill"), await stubs("decode")
    r = await router([prefill, decode], scrape_interval=60, kv_bytes_per_token=100, **FAST)
    pair = {"prefill": prefill.url, "decode": decode.url}
    status, _ = await call(r.url, {"prompt": "hello", "max_tokens": 4, "stream": True})
    assert status == 200
    status, _ = await call(r.url, {"prompt": "hello again", "max_tokens": 4})  # not streamed: no first token seen
    assert status == 200
    assert r.sample("xpyd_router_handoff_latency_seconds_count", **pair) == 1
    assert 0 < r.sample("xpyd_router_handoff_latency_seconds_sum", **pair) < 1
    assert r.sample("xpyd_router_handoff_bytes_total", **pair) == 2 * 3 * 100  # the stub's prompt_tokens: 3
    assert r.sample("xpyd_router_handoff_failures_total") == 0
    text = generate_latest(r.metrics.registry).decode()
    for stage in ("unreachable", "error"):  # the pair's failure series exist, at zero, for the dashboards
        assert f'stage="{stage}"' in text
    assert "xpyd_router_pairs_cooling_off" in text


@pytest.mark.parametrize("slow", [0.0, 0.081])
async def test_the_break_even_a_pair_is_held_to_is_a_gauge(stubs: Any, router: Any, slow: float) -> None:
    """--handoff-slow-seconds (the operator's break-even) is exported for XpydKvHandoffSlow; 0 when it is off."""
    prefill, decode = await stubs("prefill"), await stubs("decode")
    r = await router([prefill, decode], scrape_interval=60, pairs=PairLimits(slow_seconds=slow), **FAST)
    assert r.sample("xpyd_router_handoff_breakeven_seconds", deployment="test") == slow
    assert "# TYPE xpyd_router_handoff_breakeven_seconds gauge" in generate_latest(r.metrics.registry).decode()


async def test_a_handoff_slow_behind_a_queueing_decode_engine_does_not_make_the_pair_slow(
    stubs: Any, router: Any
) -> None:
    """The handoff's latency holds decode's queue: while the decode engine reports requests waiting, a slow
    handoff is the decode pool's saturation, not the pair's, and trips nothing; with no queue it trips the pair."""
    prefill, decode = await stubs("prefill"), await stubs("decode")
    limits = PairLimits(slow_seconds=1e-9, slow=1)  # every timed handoff is over this break-even
    r = await router([prefill, decode], scrape_interval=60, pairs=limits, **FAST)
    pair = {"prefill": prefill.url, "decode": decode.url}
    r.pool.workers[decode.url].waiting = 3.0  # as a scrape of a queueing engine sets it
    assert (await call(r.url, {"prompt": "queued", "max_tokens": 4, "stream": True}))[0] == 200
    assert r.sample("xpyd_router_handoff_latency_seconds_count", **pair) == 1  # still measured
    assert r.sample("xpyd_router_pairs_cooling_off") == 0
    r.pool.workers[decode.url].waiting = 0.0
    assert (await call(r.url, {"prompt": "not queued", "max_tokens": 4, "stream": True}))[0] == 200
    assert r.sample("xpyd_router_pair_trips_total", reason="slow", **pair) == 1


async def test_no_bytes_series_without_kv_bytes_per_token(stubs: Any, router: Any) -> None:
    prefill, decode = await stubs("prefill"), await stubs("decode")
    r = await router([prefill, decode], scrape_interval=60, **FAST)
    assert (await call(r.url, {"prompt": "hello", "max_tokens": 4}))[0] == 200
    text = generate_latest(r.metrics.registry).decode()
    assert "xpyd_router_handoff_bytes_total{" not in text


async def test_a_failing_pair_cools_off_and_requests_go_direct(stubs: Any, router: Any) -> None:
    """The decode leg fails after each prefill: 3 in a row trip the pair, not the workers; the next
    request, with no other decode worker for the prefill, runs on the decode worker alone."""
    prefill, decode = await stubs("prefill"), await stubs("decode", "error500")
    r = await router([prefill, decode], scrape_interval=60, max_attempts=1, **FAST)
    pair = {"prefill": prefill.url, "decode": decode.url}
    for i in range(3):
        assert (await call(r.url, {"prompt": f"p{i}", "max_tokens": 4}))[0] == 502
    assert r.sample("xpyd_router_handoff_failures_total", stage="error", **pair) == 3
    assert r.sample("xpyd_router_pair_trips_total", reason="failures", **pair) == 1
    assert r.sample("xpyd_router_pairs_cooling_off") == 1
    assert all(w.healthy for w in r.pool.workers.values())  # the workers stay in rotation
    decode.mode = "ok"
    calls = prefill.calls
    assert (await call(r.url, {"prompt": "after", "max_tokens": 4, "stream": True}))[0] == 200
    assert prefill.calls == calls  # no prefill hop: decode-only prefill
    assert "kv_transfer_params" not in decode.bodies[-1]
    assert r.sample("xpyd_router_decisions_total", role="decode", reason="pair_cooling_direct") == 1


async def test_a_handoff_whose_kv_is_gone_is_retried_decode_only_on_the_same_worker(stubs: Any, router: Any) -> None:
    """One prefill, one decode whose handoff leg fails (its prefill worker went with the KV, as in a scale-down):
    the retry runs on the decode worker alone, which computes the prompt; the decode worker's breaker counts
    nothing, so it stays in rotation however many handoffs fail, and the pair cools off."""
    prefill, decode = await stubs("prefill"), await stubs("decode", "kvfail")
    r = await router([prefill, decode], scrape_interval=60, **FAST)
    for i in range(2 * r.pool.breaker_failures):
        status, raw = await call(r.url, {"prompt": f"p{i}", "max_tokens": 4, "stream": i % 2 == 0})
        assert status == 200, raw
    assert "kv_transfer_params" not in decode.bodies[-1]
    assert all(w.healthy for w in r.pool.workers.values())
    pair = {"prefill": prefill.url, "decode": decode.url}
    assert r.sample("xpyd_router_handoff_failures_total", stage="error", **pair) == 3  # then the pair trips
    # the first two retries avoid the pair for their own request; the third failure trips it, so its retry
    # and every request after it find the pair cooling off
    assert r.sample("xpyd_router_decisions_total", role="decode", reason="pair_retry_direct") == 2
    cooled = r.sample("xpyd_router_decisions_total", role="decode", reason="pair_cooling_direct")
    assert cooled == 2 * r.pool.breaker_failures - 3 + 1
    assert r.sample("xpyd_router_errors_total", kind="worker_error") == 0


async def test_a_decode_worker_failing_direct_too_is_blamed_and_the_request_ends_502(stubs: Any, router: Any) -> None:
    prefill, decode = await stubs("prefill"), await stubs("decode", "error500")
    r = await router([prefill, decode], scrape_interval=60, **FAST)
    status, raw = await call(r.url, {"prompt": "p", "max_tokens": 4})
    assert status == 502, raw
    assert [("kv_transfer_params" in b) for b in decode.bodies] == [True, False]  # handed off, then decode-only
    assert r.sample("xpyd_router_errors_total", kind="worker_error") == 1  # the direct failure, not the handoff's


async def test_a_cooling_pair_moves_to_another_decode_worker_and_retries_are_counted(stubs: Any, router: Any) -> None:
    prefill, bad, good = await stubs("prefill"), await stubs("decode", "error500"), await stubs("decode")
    r = await router([prefill, bad, good], scrape_interval=60, **FAST)
    for i in range(30):
        assert (await call(r.url, {"prompt": f"p{i}", "max_tokens": 4}))[0] == 200  # retried on `good`
    bad_pair = {"prefill": prefill.url, "decode": bad.url}
    assert r.sample("xpyd_router_pair_trips_total", **bad_pair) == 1
    assert r.sample("xpyd_router_handoff_failures_total", **bad_pair) == 3
    assert r.sample("xpyd_router_handoff_retries_total", **bad_pair) == 3
    assert bad.calls == 3  # then the pair is out: the policy's choice of `bad` is moved to `good`


async def test_each_new_pair_gets_one_warm_up_handoff_not_counted_as_traffic(stubs: Any, router: Any) -> None:
    prefill, d1, d2 = await stubs("prefill"), await stubs("decode"), await stubs("decode")
    r = await router([prefill, d1, d2], scrape_interval=60, warm_pairs=True, **FAST)
    for _ in range(100):
        if d1.calls and d2.calls:
            break
        await asyncio.sleep(0.02)
    assert prefill.calls == 2 and d1.calls == d2.calls == 1  # one handoff per pair
    first = prefill.bodies[0]
    assert (first["model"], first["max_tokens"], first["kv_transfer_params"]["do_remote_decode"]) == (
        "stub-model", 1, True,
    )  # fmt: skip
    assert d1.bodies[0]["kv_transfer_params"]["remote_block_ids"] == [1, 2]  # the prefill's, passed on
    assert r.sample("xpyd_router_requests_total") == 0
    assert r.sample("xpyd_router_hop_latency_seconds_count") == 0
    assert r.sample("xpyd_router_handoff_failures_total") == 0
    r.pool.mark_down(d1.url)
    r.pool.apply_metrics(d1.url, WorkerMetrics())  # back up: its pairs are warmed again
    for _ in range(100):
        if d1.calls == 2:
            break
        await asyncio.sleep(0.02)
    assert d1.calls == 2 and d2.calls == 1


async def test_no_warm_up_unless_asked(stubs: Any, router: Any) -> None:
    prefill, decode = await stubs("prefill"), await stubs("decode")
    await router([prefill, decode], scrape_interval=60, **FAST)
    await asyncio.sleep(0.2)
    assert prefill.calls == decode.calls == 0


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--kv-bytes-per-token", "-1"], "--kv-bytes-per-token"),
        (["--pair-failures", "-2"], "--pair-failures"),
        (["--handoff-slow-seconds", "nan"], "--handoff-slow-seconds"),
        (["--kv-bytes-per-token", "131072", "--handoff-slow-seconds", "1.5", "--no-warm-pairs"], None),
    ],
)
def test_pair_flags(flags: list[str], problem: str | None) -> None:
    args = parser().parse_args(["--prefill", P, "--decode", D, *flags])
    found = validate(args)
    assert (found is None) if problem is None else (found is not None and problem in found)
    if problem is None:
        assert (args.kv_bytes_per_token, args.handoff_slow_seconds, args.warm_pairs) == (131072, 1.5, False)
