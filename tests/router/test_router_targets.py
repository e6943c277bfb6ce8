"""Routing targets of data-parallel replicas: names, rank endpoints, expansion, per-rank metrics."""

from __future__ import annotations

import pytest

from xpyd_router.pool import WorkerSpec, parse_worker_arg, rank_targets
from xpyd_router.scrape import parse_metrics
from xpyd_router.targets import rank_endpoint, split_target, target_name


@pytest.mark.parametrize(
    ("url", "rank", "name"),
    [
        ("http://127.0.0.1:8000", None, "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000", 0, "http://127.0.0.1:8000#dp0"),
        ("http://[::1]:8000", 71, "http://[::1]:8000#dp71"),
    ],
)
def test_target_names_round_trip(url: str, rank: int | None, name: str) -> None:
    assert target_name(url, rank) == name
    assert split_target(name) == (url, rank)


@pytest.mark.parametrize("name", ["http://h:1#dp", "http://h:1#dpx", "http://h:1#dp-1"])
def test_a_malformed_mark_is_no_rank(name: str) -> None:
    assert split_target(name) == (name, None)


@pytest.mark.parametrize(
    ("endpoint", "rank", "host", "want"),
    [
        ("tcp://10.0.0.1:5557", 0, "", "tcp://10.0.0.1:5557"),
        ("tcp://10.0.0.1:5557", 5, "", "tcp://10.0.0.1:5562"),
        ("tcp://10.0.0.1:5657", 9, "10.0.0.2", "tcp://10.0.0.2:5666"),
        ("tcp://10.0.0.1:5557", 1, "fd00::2", "tcp://[fd00::2]:5558"),
        ("", 3, "10.0.0.2", ""),
    ],
)
def test_rank_endpoint_moves_the_port_like_vllm(endpoint: str, rank: int, host: str, want: str) -> None:
    assert rank_endpoint(endpoint, rank, host) == want


def test_parse_worker_arg_refuses_a_fragment() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_worker_arg("http://127.0.0.1:8000#dp1", "prefill")


SPEC = WorkerSpec("http://10.0.0.1:8000", "prefill", "node-a", "r1", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657")


def test_one_rank_is_the_worker_itself() -> None:
    assert rank_targets(SPEC, 1) == [SPEC]


def test_ranks_on_one_pod() -> None:
    targets = rank_targets(SPEC, 4)
    assert [t.url for t in targets] == [f"http://10.0.0.1:8000#dp{r}" for r in range(4)]
    assert [t.kv_events for t in targets] == [f"tcp://10.0.0.1:{5557 + r}" for r in range(4)]
    assert [t.kv_replay for t in targets] == [f"tcp://10.0.0.1:{5657 + r}" for r in range(4)]
    assert {(t.role, t.domain, t.rev) for t in targets} == {("prefill", "node-a", "r1")}


def test_ranks_over_a_group_run_on_their_pods() -> None:
    pods = [("10.0.0.1", "node-a"), ("10.0.0.2", "node-b")]
    targets = rank_targets(SPEC, 4, 2, pods)
    assert [t.kv_events for t in targets] == [
        "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", "tcp://10.0.0.2:5559", "tcp://10.0.0.2:5560",
    ]  # fmt: skip
    assert [t.kv_replay for t in targets][2] == "tcp://10.0.0.2:5659"
    assert [t.domain for t in targets] == ["node-a", "node-a", "node-b", "node-b"]


def test_a_worker_without_events_gets_rank_targets_without_events() -> None:
    targets = rank_targets(WorkerSpec("http://10.0.0.1:8000", "worker"), 2)
    assert [(t.url, t.kv_events, t.kv_replay) for t in targets] == [
        ("http://10.0.0.1:8000#dp0", "", ""), ("http://10.0.0.1:8000#dp1", "", ""),
    ]  # fmt: skip


DP_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m",engine="1"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="120"} 1.0
"""


def test_per_rank_metrics_from_the_engine_label() -> None:
    m = parse_metrics(DP_METRICS)
    assert (m.running, m.waiting, m.kv_usage, m.num_gpu_blocks) == (4.0, 2.0, 0.5, 220)
    one = m.of_rank(1)
    assert (one.running, one.waiting, one.kv_usage, one.capacity_tokens) == (1.0, 2.0, 0.5, 1920)
    zero = m.of_rank(0)
    assert (zero.running, zero.waiting, zero.kv_usage, zero.capacity_tokens) == (3.0, 0.0, 0.25, 1600)
    assert m.of_rank(7) is m and m.of_rank(None) is m  # no such engine: the replica's figures


def test_one_engine_has_no_per_rank_table() -> None:
    m = parse_metrics('vllm:num_requests_running{engine="0",model_name="m"} 3.0\n')
    assert m.engines == {} and m.of_rank(0) is m
