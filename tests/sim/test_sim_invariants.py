"""Invariants of whole simulations: every request accounted for, causality, determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xpyd_sim import spec as specs
from xpyd_sim import trace
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.report import build
from xpyd_sim.request import SimRequest
from xpyd_sim.runner import autoscalers, colocated, routers

VOLATILE = {"wall_s", "cpu_s", "events_per_s", "peak_rss_mb", "label"}


def _simulate(
    spec: specs.SimSpec, load: list[trace.TraceRequest], cfg: SimConfig
) -> tuple[dict[str, Any], list[SimRequest]]:
    sim = Simulation(spec, load, cfg)
    seen: list[SimRequest] = []
    sim.on_finish = seen.append
    sim.run()
    return build(sim, 1.0), seen


def _check_causality(reqs: list[SimRequest]) -> None:
    for r in reqs:
        assert r.arrival <= r.prefill_start <= r.prefill_end <= r.first_token <= r.finished, r
        assert r.cached_tokens < r.prompt_tokens
        if not r.direct:
            assert r.handoff_path in ("nvlink", "rdma")
            assert r.handoff_bytes > 0
            assert r.first_token > r.prefill_end  # the KV had to move first


@pytest.mark.parametrize("router", routers())
def test_every_request_accounted_for_each_router(spec_file: Path, mooncake_file: Path, router: str) -> None:
    spec = specs.load(spec_file)
    load = list(trace.load(mooncake_file))
    out, seen = _simulate(spec, load, SimConfig(router=router))
    assert out["requests"] == out["completed"] == len(seen) == len(load)
    assert out["unfinished"] == 0
    assert out["rejected"] == 0
    assert sorted(r.rid for r in seen) == list(range(len(load)))
    _check_causality(seen)
    assert 0.0 <= out["prefix_hit_ratio"] < 1.0
    assert out["handoffs_rdma"] + out["handoffs_nvlink"] + out["direct_requests"] == len(load)


@pytest.mark.parametrize("scaler", autoscalers())
def test_autoscalers_account_and_move_replicas(spec_file: Path, scaler: str) -> None:
    spec = specs.load(spec_file)
    load = list(trace.synthetic(trace.Synthetic(rate=40, duration=240, prompt_mean=6000, output_mean=300, seed=3)))
    out, seen = _simulate(spec, load, SimConfig(autoscaler=scaler, startup_s=30))
    assert out["completed"] == len(load) == len(seen)
    _check_causality(seen)
    sizes = {(r[1], r[2]) for r in out["replicas"]}
    if scaler == "off":
        assert sizes == {(2, 2)}
        assert out["scale_events"] == 0
    else:
        assert out["scale_events"] > 0
        assert len(sizes) > 1
        assert all(1 <= p <= 4 and 1 <= d <= 4 for p, d in sizes)


def test_colocated_runs_chunked_prefill_on_one_pool(spec_file: Path, mooncake_file: Path) -> None:
    spec = colocated(specs.load(spec_file))
    load = list(trace.load(mooncake_file))
    out, seen = _simulate(spec, load, SimConfig())
    assert out["mode"] == "Colocated"
    assert out["xpyd"] == "4W"
    assert out["completed"] == len(load)
    assert out["direct_requests"] == len(load)
    assert out["kv_bytes_nic"] == out["kv_bytes_nvlink"] == 0
    _check_causality(seen)


def test_same_seed_same_results_and_seed_matters(spec_file: Path) -> None:
    spec = specs.load(spec_file)

    def once(seed: int) -> dict[str, Any]:
        base = trace.synthetic(trace.Synthetic(rate=30, duration=60, shared_prefixes=4, seed=seed))
        load = list(trace.scaled(list(base), 2, seed=seed))
        out, _ = _simulate(spec, load, SimConfig(autoscaler="xpyd"))
        return {k: v for k, v in out.items() if k not in VOLATILE}

    first, second = once(5), once(5)
    assert first == second
    assert once(6) != first


def test_bounds_stop_the_replay(spec_file: Path, mooncake_file: Path) -> None:
    spec = specs.load(spec_file)
    load = list(trace.load(mooncake_file))
    out, _ = _simulate(spec, load, SimConfig(max_requests=25))
    assert out["requests"] == out["completed"] == 25
    out, _ = _simulate(spec, load, SimConfig(duration_s=6.0))
    assert out["requests"] == sum(1 for r in load if r.arrival <= 6.0)


def test_kv_path_follows_placement(spec_file: Path, mooncake_file: Path) -> None:
    load = list(trace.load(mooncake_file))
    whole_nodes = spec_file.with_name("whole.yaml")
    whole_nodes.write_text(spec_file.read_text().replace("gpusPerReplica: 1", "gpusPerReplica: 8"))
    # 8-GPU replicas fill HGX nodes: every handoff crosses a NIC; one NVL72 clique holds them all
    hgx, _ = _simulate(specs.load(whole_nodes), load, SimConfig(router="round-robin"))
    assert hgx["kv_bytes_nic"] > 0
    assert hgx["kv_bytes_nvlink"] == 0
    nvl, _ = _simulate(specs.load(whole_nodes, topology="GB200-NVL72"), load, SimConfig(router="round-robin"))
    assert nvl["kv_bytes_nvlink"] > 0
    assert nvl["kv_bytes_nic"] == 0
    assert nvl["ttft_p50_s"] < hgx["ttft_p50_s"]
    # 1-GPU replicas share an HGX node, and the KV-aware router keeps the handoff inside it
    small, _ = _simulate(specs.load(spec_file), load, SimConfig(router="kv-aware"))
    assert small["kv_bytes_nvlink"] > 0


def test_router_replicas_keep_their_own_state(spec_file: Path, mooncake_file: Path) -> None:
    spec = specs.load(spec_file)
    load = list(trace.load(mooncake_file))
    one, _ = _simulate(spec, load, SimConfig(router="round-robin", router_replicas=1))
    two, seen = _simulate(spec, load, SimConfig(router="round-robin", router_replicas=2))
    assert two["completed"] == len(load) == len(seen)
    _check_causality(seen)
    # two round-robin replicas each start their own turn: the placement, hence the cache hits, differ
    assert one["prefix_hit_ratio"] != two["prefix_hit_ratio"]


def test_autoscaler_sees_what_prometheus_would(spec_file: Path) -> None:
    """Pool sizes count starting replicas; waiting counts unscheduled requests only."""
    sim = Simulation(specs.load(spec_file), [], SimConfig(autoscaler="xpyd"))
    cluster = sim.cluster
    cluster.add("prefill", 0.0, ready=False)
    p0 = cluster.ready("prefill")[0]
    for rid in range(3):
        p0.waiting.append(SimRequest(rid, 0.0, 20_000, 10, ()))
    p0.plan(0.0)  # the first prompt is being prefilled: running, not waiting
    obs = sim.scaler.observe(15.0, sim.itl)
    assert (obs["prefill"].replicas, obs["prefill"].ready) == (3, 2)
    assert (obs["prefill"].waiting, obs["prefill"].running) == (2.0, 1.0)
    assert obs["prefill"].prompt_tokens_rate == pytest.approx(20_000 / 15.0)
    assert obs["decode"].kv_usage == 0.0 and obs["decode"].itl_p90 is None


def test_autoscaler_sees_counters_per_scrape_and_latency_over_the_operators_minute(spec_file: Path) -> None:
    """As the operator's PromQL gives them: counters' rates between the newest two observations (irate), TTFT
    quantiles over the last RATE_WINDOW_S (rate(...[1m])): early on since the start, then from the newest
    observation at or before a minute ago."""
    sim = Simulation(specs.load(spec_file), [], SimConfig(autoscaler="xpyd"))
    p0 = sim.cluster.ready("prefill")[0]
    p0.waiting.append(SimRequest(0, 0.0, 20_000, 10, ()))
    p0.plan(0.0)
    sim.scaler.ttft_window["prefill"].append(0.4)
    seen = {t: sim.scaler.observe(t, sim.itl)["prefill"] for t in (15.0, 30.0, 45.0, 60.0, 75.0)}
    assert [seen[t].prompt_tokens_rate for t in (15.0, 30.0)] == pytest.approx([20_000 / 15, 0.0])
    assert [seen[t].request_rate for t in (15.0, 30.0)] == pytest.approx([1 / 15, 0.0])
    assert [seen[t].ttft_p90 for t in (15.0, 60.0, 75.0)] == [0.4, 0.4, None]  # finished by 15 s: out at 75 s


def test_autoscaler_sees_prompt_length_quantiles_as_histogram_quantile_reads_vllms_buckets(spec_file: Path) -> None:
    sim = Simulation(specs.load(spec_file), [], SimConfig(autoscaler="xpyd"))
    sim.scaler.prompt_window["prefill"].extend([3000] * 9 + [30_000])  # nine in (2000, 5000], one in (20k, 50k]
    seen = {t: sim.scaler.observe(t, sim.itl)["prefill"] for t in (15.0, 60.0, 75.0)}
    # ranks 5, 9 and 9.9 of 10: linear within the bucket each falls in, as Prometheus interpolates
    p = seen[15.0]
    assert (p.prompt_tokens_p50, p.prompt_tokens_p90, p.prompt_tokens_p99) == pytest.approx(
        (2000 + 3000 * 5 / 9, 5000.0, 20_000 + 30_000 * 0.9)
    )
    assert seen[60.0].prompt_tokens_p50 == p.prompt_tokens_p50
    assert seen[75.0].prompt_tokens_p50 is None  # older than the minute
