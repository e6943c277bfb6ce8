"""Table-driven tests of the SLO policy: its model's correction, the budgets, both pools, the guard rails."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from xpyd_api.models import DisaggregatedDeploymentSpec, DisaggregatedDeploymentStatus, SloSpec
from xpyd_operator.autoscaling.policy import make_policy
from xpyd_operator.autoscaling.slo import (
    MAX_UTILIZATION,
    SloPolicy,
    ahead,
    burst_floor,
    bursts,
    measure_ready,
    one_class,
    planned_quantile,
    prefill_ttft,
    prompt_mix,
    queue_growth,
    quiet,
    remember,
    sequence_lifetime,
    size_decode,
    size_prefill,
    steady_tail,
)
from xpyd_operator.autoscaling.slo import (
    settled as at_one_size,
)
from xpyd_operator.autoscaling.slomodel import (
    CORRECTION_BOUNDS,
    MIX_EDGES,
    ReplicaPerf,
    corrected,
    mix_quantile,
    mix_within,
    prompt_classes,
    replica_perfs,
    trend,
    waiting_quantile,
)
from xpyd_operator.autoscaling.spec import PoolRuntime, evaluate, policy_for, policy_inputs
from xpyd_operator.autoscaling.types import (
    PolicyInputs,
    PoolBounds,
    PoolObservation,
    PoolState,
    state_from_dict,
    state_to_dict,
)

NOW = 10_000.0
OLD = NOW - 1_000.0
SLO = SloSpec(ttft_seconds=1.0, itl_seconds=0.05, percentile=95, attainment=0.99)


def spec(slo: bool = True, topology: str = "HGX-B200") -> DisaggregatedDeploymentSpec:
    doc: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
        "topology": {"kind": topology},
        "prefill": {"replicas": 2, "gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
        "decode": {"replicas": 2, "gpusPerReplica": 8, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
        "autoscaling": {"enabled": True},
    }
    if slo:
        doc["slo"] = {"ttftSeconds": 1.0, "itlSeconds": 0.05}
    return DisaggregatedDeploymentSpec.model_validate(doc)


PERF = replica_perfs(spec())
BOUNDS = {"prefill": PoolBounds(1, 16, 8), "decode": PoolBounds(1, 16, 8)}


def obs(replicas: int, **kw: Any) -> PoolObservation:
    kw.setdefault("ready", replicas)
    kw.setdefault("sampled_at", NOW - 5)
    kw.setdefault("waiting", 0.0)
    return PoolObservation(replicas=replicas, **kw)


def inputs(prefill: PoolObservation, decode: PoolObservation, slo: SloSpec | None = SLO) -> PolicyInputs:
    return PolicyInputs({"prefill": prefill, "decode": decode}, BOUNDS, slo=slo, perf=PERF if slo else {})


def settled(n: int, **kw: Any) -> PoolState:
    return PoolState(recommendations=((OLD, n),), fresh_since=OLD, last_desired=n, **kw)


def busy_prefill(n: int, rate: float, **kw: Any) -> PoolObservation:
    return obs(n, prompt_tokens_rate=rate, request_rate=rate / 2000.0, prefix_hit_ratio=0.0, **kw)


def light_decode(n: int, running: float = 20.0, **kw: Any) -> PoolObservation:
    return obs(n, running=running, kv_usage=0.01, **kw)


def test_demand_over_the_bounds_capacity_says_so_in_words() -> None:
    flood = busy_prefill(2, 100.0 * PERF["prefill"].prefill_tokens_per_second())  # no pool size serves it
    d = SloPolicy().decide(inputs(flood, light_decode(2)), {}, NOW)
    message = d.pools["prefill"].message
    assert "unbounded (demand over capacity)" in message and "inf" not in message, message


# --- the model's correction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "observed", "predicted", "want"),
    [
        (None, 0.2, 0.1, 2.0),  # first sample taken as it is
        (1.0, 0.2, 0.1, 1.3),  # smoothed: 0.7 x 1 + 0.3 x 2
        (None, 100.0, 0.1, CORRECTION_BOUNDS[1]),  # never believed off by more than the bounds
        (None, 0.001, 0.1, CORRECTION_BOUNDS[0]),
        (1.5, None, 0.1, 1.5),  # no sample: unchanged
        (1.5, 0.2, 0.0, 1.5),  # nothing predicted: unchanged
        (None, None, 0.1, None),  # the bare model until a sample arrives
    ],
)
def test_correction_is_bounded_and_smoothed(
    previous: float | None, observed: float | None, predicted: float | None, want: float | None
) -> None:
    got = corrected(previous, observed, predicted)
    assert got == (pytest.approx(want) if want is not None else None)


def test_the_correction_is_learnt_from_observed_latency_and_shown() -> None:
    slow = light_decode(2, running=100.0, itl_p90=0.04)  # the model predicts a few ms at this batch
    d = SloPolicy().decide(inputs(busy_prefill(2, 10_000.0), slow), {}, NOW)
    assert d.state["decode"].correction is not None and d.state["decode"].correction > 1.5
    assert "correction x" in d.pools["decode"].message and "predicted attainment" in d.pools["decode"].message
    assert d.state["decode"].predicted is not None


# --- budget arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "rho", "q", "want"),
    [
        (0.1, 0.0, 0.95, 0.0),
        (0.1, 0.04, 0.95, 0.0),  # busy less than the tail share: no wait at that quantile
        (0.1, 0.5, 0.95, 0.1 / 0.5 * math.log(0.5 / 0.05)),
        (0.1, 1.0, 0.95, math.inf),
    ],
)
def test_waiting_quantile(service: float, rho: float, q: float, want: float) -> None:
    assert waiting_quantile(service, rho, q) == pytest.approx(want)


@pytest.mark.parametrize(
    ("service", "rho", "budget", "want"),
    [(0.1, 0.0, 1.0, 1.0), (0.1, 0.5, 0.05, 0.0), (0.1, 1.0, 1.0, 0.0), (0.1, 0.5, 0.1, 0.5)],
)
def test_within_budget_for_one_class(service: float, rho: float, budget: float, want: float) -> None:
    assert mix_within([(1.0, service)], rho, budget) == pytest.approx(want)


@pytest.mark.parametrize(
    ("service", "rho", "q"), [(0.1, 0.0, 0.99), (0.1, 0.04, 0.95), (0.1, 0.5, 0.95), (0.3, 0.8, 0.99)]
)
def test_one_class_mix_is_the_closed_form(service: float, rho: float, q: float) -> None:
    assert mix_quantile([(1.0, service)], rho, q) == pytest.approx(service + waiting_quantile(service, rho, q))
    closed = 1.0 if rho <= 0 else 1 - rho * math.exp(-(1 - rho) * (0.5 - service) / service)  # M/M/1 tail
    assert mix_within([(1.0, service)], rho, 0.5) == pytest.approx(closed)


@pytest.mark.parametrize(
    ("mix", "rho", "budget", "want"),
    [
        ([(0.5, 0.1), (0.5, 2.0)], 0.0, 1.0, 0.5),  # idle: the half whose own service is over the budget misses
        ([(0.9, 0.1), (0.1, 0.5)], 0.0, 1.0, 1.0),
        ([(0.9, 0.1), (0.1, 0.5)], 1.0, 1.0, 0.0),  # saturated
        # busy: each class waits behind the mean service (0.14 s), then takes its own
        (
            [(0.9, 0.1), (0.1, 0.5)],
            0.5,
            1.0,
            0.9 * (1 - 0.5 * math.exp(-0.5 * 0.9 / 0.14)) + 0.1 * (1 - 0.5 * math.exp(-0.5 * 0.5 / 0.14)),
        ),
    ],
)
def test_mix_within(mix: list[tuple[float, float]], rho: float, budget: float, want: float) -> None:
    assert mix_within(mix, rho, budget) == pytest.approx(want)


def test_a_long_tail_lifts_the_quantile_not_the_median() -> None:
    tail = [(0.9, 0.1), (0.1, 0.8)]
    assert mix_quantile(tail, 0.3, 0.5) < 0.2 < 0.8 <= mix_quantile(tail, 0.3, 0.99)
    t = mix_quantile(tail, 0.3, 0.95)  # the first time the share reaches 0.95 (it jumps where a class starts)
    assert mix_within(tail, 0.3, t - 1e-6) < 0.95 <= mix_within(tail, 0.3, t)


@pytest.mark.parametrize(
    ("quantiles", "want"),
    [
        # p50 1000, p90 5000, p99 7000: linear from 0 to the median, then between the quantiles, the last slope on
        (
            ((0.5, 1000.0), (0.9, 5000.0), (0.99, 7000.0)),
            {0.05: 100.0, 0.45: 900.0, 0.55: 1500.0, 0.9975: 7000 + 2000 / 0.09 * 0.0075},
        ),
        (((0.5, 1000.0), (0.9, 1000.0), (0.99, 1000.0)), {0.05: 100.0, 0.55: 1000.0, 0.9975: 1000.0}),  # one length
        (((0.5, 3000.0), (0.9, 2000.0), (0.99, 1000.0)), {0.55: 3000.0, 0.9975: 3000.0}),  # not monotone: held
    ],
)
def test_prompt_classes(quantiles: tuple[tuple[float, float], ...], want: dict[float, float]) -> None:
    classes = prompt_classes(quantiles)
    assert [w for w, _ in classes] == pytest.approx([hi - lo for lo, hi in itertools.pairwise(MIX_EDGES)])
    assert sum(w for w, _ in classes) == pytest.approx(1.0)
    middles = {
        round((lo + hi) / 2, 4): t for (lo, hi), (_, t) in zip(itertools.pairwise(MIX_EDGES), classes, strict=True)
    }
    for u, tokens in want.items():
        assert middles[u] == pytest.approx(tokens)


@pytest.mark.parametrize(
    ("p50", "p90", "p99", "hit", "want"),
    [
        (None, 5000.0, 7000.0, 0.0, [(1.0, 2000.0)]),  # a quantile missing: all at the mean prompt (2000)
        (0.0, 5000.0, 7000.0, 0.0, [(1.0, 2000.0)]),  # NaN/empty shows as absent or 0: the mean
        (None, None, None, 0.5, [(1.0, 1000.0)]),  # the hit ratio taken off
    ],
)
def test_prompt_mix_falls_back_to_the_mean_prompt(
    p50: float | None, p90: float | None, p99: float | None, hit: float, want: list[tuple[float, float]]
) -> None:
    o = obs(
        1,
        prompt_tokens_rate=20_000.0,
        request_rate=10.0,
        prompt_tokens_p50=p50,
        prompt_tokens_p90=p90,
        prompt_tokens_p99=p99,
    )
    assert list(prompt_mix(o, hit)) == want


def test_prompt_mix_takes_the_hits_off_as_a_share_up_to_the_mean_prompt_as_tokens_past_it() -> None:
    """A cached prefix (a system prompt, earlier turns) does not grow with the prompt: a prompt up to the mean
    (2,000 tokens here) hits its share (25%), a longer one the 500 tokens the mean prompt hits."""
    o = obs(
        1,
        prompt_tokens_rate=20_000.0,
        request_rate=10.0,
        prompt_tokens_p50=1000.0,
        prompt_tokens_p90=5000.0,
        prompt_tokens_p99=7000.0,
    )
    cold, warm = prompt_mix(o, 0.0), prompt_mix(o, 0.25)
    want = [t * 0.75 if t <= 2000.0 else t - 500.0 for _, t in cold]
    assert [t for _, t in warm] == pytest.approx(want)
    assert any(t > 2000.0 for _, t in cold) and any(t < 2000.0 for _, t in cold)


def test_a_tail_no_replica_serves_in_time_is_not_paid_for() -> None:
    """A tenth of the prompts take longer than the budget on an idle replica: the goal is planned as its
    share of what the bound reaches, with the prompt mix, rather than the bound bought for them; and the
    mean-prompt model, not seeing them, would size for its mean only."""
    perf = PERF["prefill"]
    cap = perf.prefill_tokens_per_second()
    long = 1.5 * cap  # 1.5 s of compute alone
    mix = [(0.9, 2_000.0), (0.1, long)]
    mean = 0.9 * 2_000 + 0.1 * long
    n, _, attain = size_prefill(perf, 1.0, mix, 4 * cap, 1.0, 0.99, 16, cap)
    best = mix_within([(w, perf.prefill_seconds(t)) for w, t in mix], 4 / 16, 1.0)
    assert best < 0.9 and attain >= 0.99 * best and n < 16
    assert size_prefill(perf, 1.0, one_class(mean), 4 * cap, 1.0, 0.99, 16, cap)[0] == 16  # the mean prompt: the bound


@pytest.mark.parametrize(("percentile", "attainment", "want"), [(95, 0.99, 0.99), (99, 0.9, 0.99), (90, 0.5, 0.9)])
def test_planned_quantile_is_the_stricter(percentile: int, attainment: float, want: float) -> None:
    assert (
        planned_quantile(SloSpec(ttft_seconds=1, itl_seconds=0.05, percentile=percentile, attainment=attainment))
        == want
    )


def test_a_smaller_ttft_budget_needs_more_prefill() -> None:
    perf = PERF["prefill"]
    cap = perf.prefill_tokens_per_second()
    sizes = [size_prefill(perf, 1.0, one_class(4000), 3 * cap, budget, 0.99, 16, cap)[0] for budget in (2.0, 0.5, 0.2)]
    assert sizes == sorted(sizes) and sizes[0] >= 4 and sizes[-1] > sizes[0]


def test_a_slower_model_needs_more_prefill() -> None:
    perf = PERF["prefill"]
    cap = perf.prefill_tokens_per_second()
    fast = size_prefill(perf, 1.0, one_class(4000), 2 * cap, 0.5, 0.99, 16, cap)[0]
    slow = size_prefill(perf, 3.0, one_class(4000), 2 * cap, 0.5, 0.99, 16, cap)[0]
    assert slow > fast


@pytest.mark.parametrize(
    ("new_tokens", "rate_x", "correction", "want"),
    [
        # prompts whose service alone is over the budget miss it on any size: sized by throughput
        (60_000, 1.5, 1.0, math.ceil(1.5 / MAX_UTILIZATION)),
        # reachable: the planned quantile
        (2_000, 1.5, 1.0, None),
    ],
)
def test_an_unreachable_goal_does_not_buy_the_whole_bound(
    new_tokens: float, rate_x: float, correction: float, want: int | None
) -> None:
    perf = PERF["prefill"]
    cap = perf.prefill_tokens_per_second()
    n, ttft, _ = size_prefill(perf, correction, one_class(new_tokens), rate_x * cap, 1.0, 0.99, 16, cap)
    if want is None:
        assert n < 16 and ttft <= 1.0
    else:
        assert n == want and ttft > 1.0


def test_a_goal_out_of_reach_is_planned_as_its_share_of_the_best() -> None:
    """Service near the budget: 16 replicas reach under 99 %; plan 99 % of what 16 reach, not 16."""
    perf = PERF["prefill"]
    cap = perf.prefill_tokens_per_second()
    n, _, attain = size_prefill(perf, 2.6, one_class(8_000), 0.6 * cap, 0.99, 0.99, 16, cap)
    _, service, rho = prefill_ttft(perf, 2.6, one_class(8_000), 0.6 * cap, 16, 0.99, cap)
    best = mix_within([(1.0, service)], rho, 0.99)
    assert best < 0.99 and n < 16 and attain >= 0.99 * best


def test_trend_and_ahead() -> None:
    assert trend([(0, 1.0), (10, 2.0), (20, 3.0)]) == pytest.approx(0.1)
    assert trend([(0, 1.0), (10, 2.0)]) == 0.0  # too few points
    falling = PoolState(demand=((NOW - 30, 300.0), (NOW - 15, 200.0)))
    assert ahead(falling, NOW, 100.0, 60.0, 300.0)[0] == 100.0  # never below now


@pytest.mark.parametrize(
    ("history", "horizon", "want"),
    [
        # a trend fitted over 30 s is extrapolated 30 s, not the 60 s a replica takes
        (((NOW - 30, 100.0), (NOW - 15, 200.0)), 60.0, 300.0 + 30.0 * 100.0 / 15),
        # fitted over 90 s: the whole horizon
        (((NOW - 90, 0.0), (NOW - 60, 100.0), (NOW - 30, 200.0)), 60.0, 300.0 + 60.0 * 100.0 / 30),
        # a shorter horizon than the history: the horizon
        (((NOW - 90, 0.0), (NOW - 60, 100.0), (NOW - 30, 200.0)), 15.0, 300.0 + 15.0 * 100.0 / 30),
    ],
)
def test_ahead_extrapolates_no_further_than_its_history(
    history: tuple[tuple[float, float], ...], horizon: float, want: float
) -> None:
    value, st = ahead(PoolState(demand=history), NOW, 300.0, horizon, 300.0)
    assert value == pytest.approx(want) and st.demand[-1] == (NOW, 300.0)


@pytest.mark.parametrize(
    ("previous", "waiting", "want"),
    [
        (None, 500.0, 0.0),  # first sample: nothing to compare with
        ((NOW - 15, 0.0), 300.0, 20.0),  # grew by 300 in 15 s
        ((NOW - 15, 300.0), 100.0, 0.0),  # draining: no unserved arrivals
        ((NOW, 0.0), 300.0, 0.0),  # no time passed
    ],
)
def test_queue_growth(previous: tuple[float, float] | None, waiting: float, want: float) -> None:
    rate, st = queue_growth(PoolState(queue=previous), NOW, waiting)
    assert rate == pytest.approx(want) and st.queue == (NOW, waiting)


def test_a_growing_queue_is_demand_the_served_rate_does_not_show() -> None:
    """A spike: the pool serves what one replica can while the queue grows; growth sizes the pool."""
    cap = PERF["prefill"].prefill_tokens_per_second()
    served = busy_prefill(1, cap, waiting=600.0)
    quiet = {"prefill": settled(1, queue=(NOW - 15, 600.0)), "decode": settled(1)}
    growing = {"prefill": settled(1, queue=(NOW - 15, 0.0)), "decode": settled(1)}
    flat = SloPolicy().decide(inputs(served, light_decode(1)), quiet, NOW).pools["prefill"].desired
    grown = SloPolicy().decide(inputs(served, light_decode(1)), growing, NOW).pools["prefill"].desired
    assert flat == 2 and grown >= 3  # 600 queued in 15 s of 2,000-token prompts: ~1.7 replicas more
    assert state_from_dict(state_to_dict({"p": settled(1, queue=(NOW, 600.0))}))["p"].queue == (NOW, 600.0)


@pytest.mark.parametrize(
    ("replicas", "ready", "waiting", "before", "learns"),
    [
        (2, 2, 0.0, 0.0, True),  # steady: the engines' TTFT says how far off the model is
        (4, 2, 0.0, 0.0, False),  # replicas starting: TTFT is the wait for them
        (2, 2, 50.0, 0.0, False),  # a backlog: TTFT is its wait, not the model's error
        (2, 2, 0.0, 50.0, False),  # a backlog just drained: the interval's TTFT is still its wait
    ],
)
def test_the_prefill_correction_is_learnt_in_a_steady_state(
    replicas: int, ready: int, waiting: float, before: float, learns: bool
) -> None:
    pool = busy_prefill(replicas, 20_000.0, ready=ready, waiting=waiting, ttft_p90=0.9)
    d = SloPolicy().decide(inputs(pool, light_decode(2)), {"prefill": PoolState(queue=(NOW - 15, before))}, NOW)
    assert (d.state["prefill"].correction != 1.0) is learns


@pytest.mark.parametrize(
    ("resized_ago", "ready_s", "learns"),
    [
        (None, None, True),  # never resized: the minute's latency is all at this size
        (30.0, None, False),  # resized half a minute ago: the quantiles still span the old size
        (100.0, None, False),  # ... and the new replicas' time to Ready (60 s until measured) after it
        (130.0, None, True),  # a minute at this size since they were Ready
        (100.0, 20.0, True),  # replicas measured Ready in 20 s: a minute at this size by 80 s
    ],
)
def test_the_correction_waits_for_a_minute_of_latency_at_the_current_size(
    resized_ago: float | None, ready_s: float | None, learns: bool
) -> None:
    last = None if resized_ago is None else NOW - resized_ago
    assert at_one_size(PoolState(last_scale_time=last), NOW, ready_s or 60.0) is learns
    prefill = PoolState(queue=(NOW - 15, 0.0), last_scale_time=last, ready_seconds=ready_s, last_desired=2)
    decode = PoolState(last_scale_time=last, ready_seconds=ready_s, last_desired=2)
    slow = light_decode(2, running=100.0, itl_p90=0.04)
    pool = busy_prefill(2, 20_000.0, ttft_p90=0.9)
    d = SloPolicy().decide(inputs(pool, slow), {"prefill": prefill, "decode": decode}, NOW)
    assert (d.state["prefill"].correction != 1.0) is learns
    assert (d.state["decode"].correction != 1.0) is learns


# --- both pools ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequences", "context", "itl", "limit"),
    [
        (10.0, 2000.0, 0.05, "itl"),  # light: one replica
        (2000.0, 2000.0, 0.05, "batch"),  # many short sequences: the engine's batch cap
        (2000.0, 30_000.0, 0.05, "kv-cache"),  # long contexts: the KV cache
    ],
)
def test_decode_sizing_limits(sequences: float, context: float, itl: float, limit: str) -> None:
    n, predicted, why = size_decode(PERF["decode"], 1.0, sequences, context, itl, 64)
    assert why == limit
    assert predicted <= itl
    if limit == "itl":
        assert n == 1


@pytest.mark.parametrize(
    ("engine_args", "decode_args", "want_decode", "want_prefill"),
    [
        ([], [], 256, 256),  # vLLM's default
        ([], ["--max-num-seqs", "16"], 16, 256),
        (["--max-num-seqs=64"], [], 64, 64),  # the engine's args reach every pool...
        (["--max-num-seqs=64"], ["--max-num-seqs", "8"], 8, 64),  # ...a pool's own come last and win
        ([], ["--max-running-requests", "32"], 32, 256),  # SGLang's name
        ([], ["--max-num-seqs", "0"], 256, 256),  # nonsense: the engine will say so; the default meanwhile
    ],
)
def test_the_batch_cap_is_the_pools_max_num_seqs(
    engine_args: list[str], decode_args: list[str], want_decode: int, want_prefill: int
) -> None:
    doc = spec().model_dump(by_alias=True, exclude_none=True)
    doc["engine"] = {**doc.get("engine", {}), "args": engine_args}
    doc["decode"]["args"] = decode_args
    perfs = replica_perfs(DisaggregatedDeploymentSpec.model_validate(doc))
    assert (perfs["decode"].max_seqs, perfs["prefill"].max_seqs) == (want_decode, want_prefill)


@pytest.mark.parametrize(("max_seqs", "want"), [(256, 1), (16, 4)])
def test_a_small_batch_cap_grows_decode(max_seqs: int, want: int) -> None:
    """48 sequences of short answers: one replica's step meets the ITL, but a batch of 16 queues 32 of them."""
    perf = replace(PERF["decode"], max_seqs=max_seqs)
    n, _, why = size_decode(perf, 1.0, 48.0, 800.0, 0.05, 64)
    assert (n, why) == (want, "itl" if want == 1 else "batch")


def test_both_pools_follow_the_mix() -> None:
    cap = PERF["prefill"].prefill_tokens_per_second()
    policy = SloPolicy()
    # prompt-heavy: prefill grows, decode stays small
    d = policy.decide(inputs(busy_prefill(2, 3 * cap), light_decode(2)), {}, NOW)
    assert d.pools["prefill"].desired > 2 and d.pools["decode"].desired <= 2
    # output-heavy: many long-running sequences, few prompt tokens
    d = policy.decide(inputs(busy_prefill(2, 0.05 * cap), obs(2, running=1200.0, kv_usage=0.5)), {}, NOW)
    assert d.pools["prefill"].desired <= 2 and d.pools["decode"].desired > 2


@pytest.mark.parametrize(
    ("tails", "p99", "want", "kept"),
    [
        ((), 9000.0, 9000.0, 1),  # no history: as scraped
        (((NOW - 45, 9000.0),), 40_000.0, 9000.0, 2),  # a longer tail than a minute ago: not yet
        (((NOW - 60, 9000.0), (NOW - 30, 30_000.0)), 40_000.0, 30_000.0, 2),  # the minute-old sample is gone
        (((NOW - 15, 40_000.0),), 9000.0, 9000.0, 2),  # a shorter tail acts at once
        (((NOW - 15, 9000.0),), None, None, 1),  # not scraped: nothing to plan with, the history kept
    ],
)
def test_a_longer_prompt_tail_counts_once_it_has_held_a_minute(
    tails: tuple[tuple[float, float], ...], p99: float | None, want: float | None, kept: int
) -> None:
    got, st = steady_tail(PoolState(tails=tails), NOW, p99)
    assert got == want and len(st.tails) == kept
    assert state_from_dict(state_to_dict({"p": st}))["p"].tails == st.tails


def test_a_minute_of_long_prompts_does_not_grow_prefill_a_tail_that_holds_does() -> None:
    """vLLM's prompt histogram puts 20,000 to 50,000 tokens in one bucket: a few long prompts lift its p99
    from 9,000 to 40,000 tokens, and the p99 class, priced near the TTFT budget, would buy replicas."""
    cap = PERF["prefill"].prefill_tokens_per_second()
    tail = {"prompt_tokens_p50": 2500.0, "prompt_tokens_p90": 6000.0, "prompt_tokens_p99": 40_000.0}
    now = obs(4, prompt_tokens_rate=2 * cap, request_rate=2 * cap / 3000.0, prefix_hit_ratio=0.0, **tail)
    short = settled(4, tails=((NOW - 30, 9000.0),))
    held = settled(4, tails=((NOW - 75, 9000.0),))
    desired = {
        name: SloPolicy().decide(inputs(now, light_decode(2)), {"prefill": st}, NOW).pools["prefill"].desired
        for name, st in (("short", short), ("held", held))
    }
    assert desired["short"] < desired["held"], desired


def test_prefix_hits_shrink_the_prefill_demand() -> None:
    cap = PERF["prefill"].prefill_tokens_per_second()
    cold = SloPolicy().decide(inputs(busy_prefill(2, 4 * cap), light_decode(2)), {}, NOW)
    hot_obs = replace(busy_prefill(2, 4 * cap), prefix_hit_ratio=0.75)
    hot = SloPolicy().decide(inputs(hot_obs, light_decode(2)), {}, NOW)
    assert hot.pools["prefill"].desired < cold.pools["prefill"].desired


# --- guard rails (XpydPolicy's, reused) ---------------------------------------------------------


def test_missing_data_holds() -> None:
    stale = obs(3, sampled_at=NOW - 10_000)
    d = SloPolicy().decide(inputs(stale, light_decode(3)), {}, NOW)
    assert (d.pools["prefill"].desired, d.pools["prefill"].reason) == (3, "no-data")
    blind = obs(3)  # fresh, but the prompt-token rate is not scraped
    d = SloPolicy().decide(inputs(blind, light_decode(3)), {"prefill": settled(3)}, NOW)
    assert d.pools["prefill"].desired == 3 and "missing" in d.pools["prefill"].message
    no_kv = obs(4, running=10.0)
    d = SloPolicy().decide(inputs(busy_prefill(1, 1000.0), no_kv), {"decode": settled(4)}, NOW)
    assert d.pools["decode"].desired == 4 and not d.healthy


def test_a_manual_edit_is_the_new_target() -> None:
    # the policy last asked for 2; a user set 6: idle load does not shrink it within the window
    st = {"prefill": settled(2), "decode": settled(2)}
    d = SloPolicy().decide(inputs(busy_prefill(6, 100.0), light_decode(2)), st, NOW)
    assert d.pools["prefill"].desired == 6 and d.pools["prefill"].reason == "stabilizing"


@pytest.mark.parametrize(
    ("running", "rate", "decode_rates", "want"),
    [
        (20.0, 10.0, None, 2.0),  # Little's law: 20 in decode, 10 through per second -> 2 s each
        (20.0, 10.0, (2000.0, 10.0, 0.05), 2.0),  # Little's law first while sequences run
        (0.0, 10.0, None, math.inf),  # nothing running, no decode rates: not measured
        (0.0, 10.0, (2000.0, 10.0, 0.005), 1.0),  # none caught running: 200 tokens each at 5 ms
        (0.0, 10.0, (0.0, 10.0, 0.005), math.inf),  # nothing generated
        (0.0, 10.0, (2000.0, 0.0, 0.005), math.inf),  # no request through decode
        (0.0, 10.0, (2000.0, 10.0, None), math.inf),  # no ITL
        (20.0, 0.0, None, math.inf),  # nothing through prefill: not measured
        (20.0, None, None, math.inf),
        (None, 10.0, None, math.inf),
    ],
)
def test_sequence_lifetime(
    running: float | None, rate: float | None, decode_rates: tuple[float, float, float | None] | None, want: float
) -> None:
    tokens, done, itl = decode_rates or (None, None, None)
    decode = obs(1, running=running, generation_tokens_rate=tokens, request_rate=done, itl_p90=itl)
    pools = {"prefill": obs(1, request_rate=rate), "decode": decode}
    assert sequence_lifetime(PolicyInputs(pools, BOUNDS)) == pytest.approx(want)


@pytest.mark.parametrize(
    ("role", "rate", "age", "want", "reason"),
    [
        ("prefill", 100.0, 120.0, 4, "stabilizing"),  # arrivals: the size the user set holds a window (300 s)
        ("prefill", 100.0, 299.0, 4, "stabilizing"),
        ("prefill", 100.0, 301.0, 1, "scale-down"),
        # what it holds: a few sequence lifetimes (20 running / requests per second), a minute at most
        ("decode", 100.0, 59.0, 4, "stabilizing"),  # 0.05 req/s: 400 s each, so the minute
        ("decode", 100.0, 61.0, 1, "scale-down"),
        ("decode", 20_000.0, 5.0, 4, "stabilizing"),  # 10 req/s: 2 s each, 6 s to settle
        ("decode", 20_000.0, 7.0, 1, "scale-down"),
    ],
)
def test_a_size_the_user_set_holds_a_window_in_prefill_a_few_sequence_lifetimes_in_decode(
    role: str, rate: float, age: float, want: int, reason: str
) -> None:
    # started (or edited) at 4 replicas `age` s ago, fresh data since, light load on both pools
    started = PoolState(fresh_since=NOW - age, last_desired=4)
    d = SloPolicy().decide(inputs(busy_prefill(4, rate), light_decode(4)), {role: started}, NOW)
    assert (d.pools[role].desired, d.pools[role].reason) == (want, reason)


@pytest.mark.parametrize(
    ("minimum", "prefill_rate", "decode_running", "held", "want"),
    [
        (0, 0.0, 0.0, 0.0, {"prefill": 0, "decode": 0}),  # idle, minReplicas 0: both to zero
        (1, 0.0, 0.0, 0.0, {"prefill": 1, "decode": 1}),  # idle, minReplicas 1: the floor
        (0, 0.0, 5.0, 0.0, {"prefill": 0, "decode": 1}),  # answers still streaming: decode stays
        (0, 1000.0, 0.0, 0.0, {"prefill": 1, "decode": 1}),  # prompts computed: their answers are on the way
        (0, 0.0, 0.0, 3.0, {"prefill": 1, "decode": 1}),  # requests held in the router: not idle
    ],
)
def test_an_idle_pool_goes_to_its_minimum_zero_included(
    minimum: int, prefill_rate: float, decode_running: float, held: float, want: dict[str, int]
) -> None:
    bounds = {role: PoolBounds(minimum, 16, 8) for role in ("prefill", "decode")}
    prefill = busy_prefill(1, prefill_rate, held=held)
    decode = obs(1, running=decode_running, kv_usage=0.01 if decode_running else 0.0, held=held)
    i = PolicyInputs({"prefill": prefill, "decode": decode}, bounds, slo=SLO, perf=PERF)
    d = SloPolicy().decide(i, {"prefill": settled(1), "decode": settled(1)}, NOW)
    assert {role: p.desired for role, p in d.pools.items()} == want


def test_stabilization_keeps_the_window_max() -> None:
    # while a backlog is still being served, the window's recommendations stand
    st = {
        "prefill": PoolState(recommendations=((NOW - 100, 5),), fresh_since=OLD, last_desired=5),
        "decode": settled(2),
    }
    d = SloPolicy().decide(inputs(busy_prefill(5, 100.0, waiting=20.0), light_decode(2)), st, NOW)
    assert d.pools["prefill"].desired == 5 and "window max 5" in d.pools["prefill"].message
    later = {**st, "prefill": PoolState(recommendations=((NOW - 400, 5),), fresh_since=OLD, last_desired=5)}
    d = SloPolicy().decide(inputs(busy_prefill(5, 100.0, waiting=20.0), light_decode(2)), later, NOW)
    assert d.pools["prefill"].desired < 5


# --- one-off transients and recurring bursts -----------------------------------------------------


@pytest.mark.parametrize(
    ("needs", "now", "need", "want"),
    [
        ((), 100.0, 2, ((100.0, 2),)),  # the first size asked for
        (((0.0, 2),), 100.0, 2, ((0.0, 2),)),  # unchanged: nothing new kept
        (((0.0, 2),), 100.0, 3, ((0.0, 2), (100.0, 3))),  # a change is kept
        # older than the memory (600 s): dropped, but the size in force when the memory begins is kept
        (((0.0, 1), (50.0, 3), (400.0, 1)), 700.0, 2, ((50.0, 3), (400.0, 1), (700.0, 2))),
    ],
)
def test_remember_keeps_the_changes_within_the_memory(
    needs: tuple[tuple[float, int], ...], now: float, need: int, want: tuple[tuple[float, int], ...]
) -> None:
    assert remember(needs, now, need, 600.0) == want


@pytest.mark.parametrize(
    ("sizes", "peaks", "floor"),
    [
        ((), [], None),
        ((1, 1, 1), [], None),  # flat: no burst
        ((1, 4, 7, 4, 1), [7], None),  # one spike, served and gone: a one-off transient
        ((1, 3, 1, 4, 1), [3, 4], 4),  # bursts that recur: the highest is kept
        ((1, 6, 1, 2, 1), [6, 2], None),  # a small blip after a spike is not a recurrence
        ((5, 4, 3, 2, 3, 2), [3], None),  # a run above the lowest when the memory begins: its start is unseen
        ((1, 2, 3, 4, 5, 4, 3), [5], None),  # a ramp is one burst
    ],
)
def test_bursts_and_the_floor_while_they_recur(sizes: tuple[int, ...], peaks: list[int], floor: int | None) -> None:
    needs = tuple((float(i) * 15.0, n) for i, n in enumerate(sizes))
    assert bursts(needs) == peaks
    assert burst_floor(needs) == floor


def transient(needs: tuple[int, ...], held: int, age: float) -> PoolState:
    """A pool grown to `held` for a spike `age` s ago (the window: 300 s), the sizes it asked for in memory."""
    spaced = tuple((NOW - 900.0 + 60.0 * i, n) for i, n in enumerate(needs))
    return PoolState(
        recommendations=((NOW - age, held),),
        fresh_since=OLD,
        last_desired=held,
        last_direction=1,
        last_direction_change_time=NOW - age,
        needs=spaced,
    )


@pytest.mark.parametrize(
    ("needs", "age", "waiting", "ready", "want", "reason"),
    [
        ((1, 7, 1), 200.0, 0.0, 7, 7, "stabilizing"),  # a spike, served: held for the window (another may come)
        ((1, 7, 1), 400.0, 0.0, 7, 1, "scale-down"),  # ... past it, a one-off: released
        ((1, 7, 1), 200.0, 50.0, 7, 7, "stabilizing"),  # its backlog still served: the window stands
        ((1, 5, 1, 7, 1), 200.0, 0.0, 7, 7, "stabilizing"),  # bursts recur: the window stands
        ((1, 5, 1, 7, 1), 400.0, 0.0, 7, 7, "stabilizing"),  # ... and past it, the highest burst in memory
        ((1, 3, 1, 4, 1), 400.0, 0.0, 7, 4, "scale-down"),  # ... down to it, not below
    ],
)
def test_a_burst_is_held_for_the_window_and_recurring_ones_are_kept(
    needs: tuple[int, ...], age: float, waiting: float, ready: int, want: int, reason: str
) -> None:
    st = {"prefill": transient(needs, 7, age), "decode": settled(2)}
    d = SloPolicy().decide(inputs(busy_prefill(7, 100.0, waiting=waiting, ready=ready), light_decode(2)), st, NOW)
    assert (d.pools["prefill"].desired, d.pools["prefill"].reason) == (want, reason)
    if want > 1 and ready == 7 and waiting == 0:
        assert ("bursts recur" in d.pools["prefill"].message) == (burst_floor(st["prefill"].needs) is not None)
    assert d.state["prefill"].needs[-1][1] == 1  # what the load asks now, remembered


@pytest.mark.parametrize(
    ("idle_since", "is_idle", "want_since", "forgets"),
    [
        (None, False, None, False),  # busy
        (NOW - 400.0, False, None, False),  # busy again: the idle spell ends
        (None, True, NOW, False),  # idle from now
        (NOW - 299.0, True, NOW - 299.0, False),  # idle, not yet a window
        (NOW - 300.0, True, NOW - 300.0, True),  # idle a whole window: the bursts are forgotten
    ],
)
def test_quiet(idle_since: float | None, is_idle: bool, want_since: float | None, forgets: bool) -> None:
    st = quiet(PoolState(needs=((NOW - 500.0, 3),), idle_since=idle_since), NOW, is_idle, 300.0)
    assert (st.idle_since, st.needs == ()) == (want_since, forgets)


@pytest.mark.parametrize(
    ("idle_for", "want", "reason", "forgot"),
    [
        (None, 7, "stabilizing", False),  # serving: the highest burst in memory holds
        (0.0, 7, "stabilizing", False),  # idle from now: a lull between requests may be only that
        (200.0, 7, "stabilizing", False),  # idle, not yet a window
        (300.0, 1, "scale-down", True),  # idle a whole window (300 s): the load stopped, its bursts forgotten
    ],
)
def test_a_pool_idle_for_a_window_forgets_its_bursts(
    idle_for: float | None, want: int, reason: str, forgot: bool
) -> None:
    since = None if idle_for is None else NOW - idle_for
    st = {"prefill": replace(transient((1, 5, 1, 7, 1), 7, 400.0), idle_since=since), "decode": settled(1)}
    rate = 100.0 if idle_for is None else 0.0
    pool = obs(7, prompt_tokens_rate=rate, request_rate=rate / 2000.0, prefix_hit_ratio=0.0, running=0.0)
    d = SloPolicy().decide(inputs(pool, obs(1, running=0.0, kv_usage=0.0)), st, NOW)
    assert (d.pools["prefill"].desired, d.pools["prefill"].reason) == (want, reason)
    assert ("bursts recur" in d.pools["prefill"].message) == (not forgot)
    assert (d.state["prefill"].needs == ((NOW, 1),)) == forgot  # forgotten: the memory starts anew
    assert d.state["prefill"].idle_since == (None if idle_for is None else since)
    assert state_from_dict(state_to_dict(d.state))["prefill"].idle_since == d.state["prefill"].idle_since


@pytest.mark.parametrize(("held", "window_max", "want"), [(8, 2, 2), (8, 8, 8), (3, 1, 1)])
def test_scale_down_goes_straight_to_the_window_max(held: int, window_max: int, want: int) -> None:
    st = {
        "prefill": PoolState(recommendations=((NOW - 400, held), (NOW - 100, window_max)), fresh_since=OLD),
        "decode": settled(2),
    }
    st["prefill"] = replace(st["prefill"], last_desired=held)
    d = SloPolicy().decide(inputs(busy_prefill(held, 100.0, waiting=20.0), light_decode(2)), st, NOW)
    assert d.pools["prefill"].desired == want


def test_time_to_ready_is_measured() -> None:
    grown = PoolState(pending_since=NOW - 90)
    assert measure_ready(obs(4, ready=3), grown, NOW).ready_seconds is None  # not all Ready yet
    assert measure_ready(obs(4, ready=4), grown, NOW).ready_seconds == pytest.approx(90)
    d = SloPolicy().decide(inputs(busy_prefill(1, 200_000.0), light_decode(1)), {}, NOW)
    assert d.pools["prefill"].desired > 1 and d.state["prefill"].pending_since == NOW


def test_without_slo_or_model_it_is_the_threshold_policy() -> None:
    d = SloPolicy().decide(inputs(obs(2, waiting=10.0), light_decode(2), slo=None), {}, NOW)
    assert d.pools["prefill"].desired == 5  # XpydPolicy: 10 waiting / 2 per replica
    assert replica_perfs(spec(topology="Any")) == {}


def test_the_spec_selects_the_policy_and_status_shows_the_learning() -> None:
    assert isinstance(policy_for(spec()), SloPolicy) and not isinstance(policy_for(spec(slo=False)), SloPolicy)
    assert isinstance(make_policy("slo"), SloPolicy)
    runtimes = {"prefill": PoolRuntime(2, 2, 0), "decode": PoolRuntime(2, 2, 0)}
    metrics = {"prefill": busy_prefill(2, 10_000.0, ttft_p90=0.3), "decode": light_decode(2, itl_p90=0.01)}
    assert policy_inputs(spec(), runtimes, metrics).perf.keys() == {"prefill", "decode"}
    result = evaluate(spec(), DisaggregatedDeploymentStatus(), 1, runtimes, metrics, NOW)
    assert {"sloCorrection", "predictedAttainment", "readySeconds"} <= set(result.status["decode"])
    history = state_from_dict(state_to_dict(result.decision.state))
    assert history["decode"].correction == result.decision.state["decode"].correction
    assert history["prefill"].needs == result.decision.state["prefill"].needs != ()


def test_replica_perf_prices_from_the_catalog() -> None:
    perf = PERF["decode"]
    assert isinstance(perf, ReplicaPerf) and perf.kv_capacity_tokens > 100_000
    assert perf.decode_step_seconds(64, 2000) > perf.decode_step_seconds(1, 2000)
    assert perf.prefill_seconds(16_000) > perf.prefill_seconds(1_000) > 0


def test_operator_metrics_show_the_learning() -> None:
    from prometheus_client import CollectorRegistry

    from xpyd_operator.autoscaling.metrics import AutoscalerMetrics

    registry = CollectorRegistry()
    m = AutoscalerMetrics(registry)
    st = {"prefill": PoolState(ready_seconds=75.0), "decode": PoolState()}
    d = SloPolicy().decide(inputs(busy_prefill(2, 10_000.0, ttft_p90=0.2), light_decode(2, itl_p90=0.01)), st, NOW)
    m.record("ns", "dep", d, {"prefill": 2, "decode": 2}, {"prefill": 2, "decode": 2})
    labels = {"namespace": "ns", "deployment": "dep", "role": "decode"}
    got = registry.get_sample_value("xpyd_autoscaler_slo_model_correction", labels)
    assert got == pytest.approx(d.state["decode"].correction)
    assert registry.get_sample_value("xpyd_autoscaler_slo_predicted_attainment", labels) == d.state["decode"].predicted
    ready = registry.get_sample_value("xpyd_autoscaler_replica_ready_seconds", {**labels, "role": "prefill"})
    assert ready == 75.0
    assert registry.get_sample_value("xpyd_autoscaler_replica_ready_seconds", labels) is None  # not measured yet
