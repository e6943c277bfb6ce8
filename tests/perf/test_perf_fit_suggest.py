"""The smallest replica that fits a topology: the sizes it offers, the layouts a model prefers, the span."""

from __future__ import annotations

import pytest

from xpyd_api import rules
from xpyd_perf import TOPOLOGIES, quantized, resolve_model, resolve_topology
from xpyd_perf.fits import (
    MAX_SEARCH_GPUS,
    layout_problem,
    layouts,
    pods_per_replica,
    replica_fit,
    replica_sizes,
    smallest_fit,
    span,
)


@pytest.mark.parametrize(
    ("topology", "head", "last"),
    [
        ("HGX-B200", [1, 2, 4, 8, 16, 24, 32], 256),  # powers of two within a node, whole nodes beyond
        ("GB200-NVL72", [1, 2, 4, 8, 12, 16, 20], 72),  # whole trays, up to the rack's NVLink domain
        ("H100", [1, 2, 4, 8, 16], 256),
    ],
)
def test_replica_sizes(topology: str, head: list[int], last: int) -> None:
    sizes = replica_sizes(resolve_topology(topology))
    assert sizes[: len(head)] == head
    assert sizes[-1] == last
    assert replica_sizes(resolve_topology(topology), max_gpus=4) == [1, 2, 4]


def test_the_search_stops_where_the_api_does() -> None:
    assert rules.MAX_REPLICA_GPUS == MAX_SEARCH_GPUS


@pytest.mark.parametrize(
    ("model", "topology", "gpus", "want"),
    [
        ("deepseek-v3", "HGX-B200", 8, [(1, 8, True), (8, 1, False)]),  # MoE: wide expert parallel first
        ("deepseek-v3", "HGX-B200", 16, [(1, 16, True)]),  # tensor parallel stays inside the node
        ("deepseek-v3", "GB200-NVL72", 16, [(1, 16, True), (16, 1, False)]),  # ... the rack on NVL72
        ("llama-3.1-70b", "HGX-B200", 4, [(4, 1, False)]),  # dense: tensor parallel
        ("llama-3.1-70b", "GB200-NVL72", 12, []),  # 64 heads do not split 12 ways
        ("llama-3.1-70b", "HGX-B200", 16, []),  # nor across nodes
        ("gpt-oss-120b", "HGX-B200", 1, [(1, 1, False)]),
    ],
)
def test_layouts(model: str, topology: str, gpus: int, want: list[tuple[int, int, bool]]) -> None:
    assert layouts(resolve_model(model), resolve_topology(topology), gpus) == want


# (model, topology, --max-model-len, GPUs, TP, DP, EP, pods): what each model's numbers give.
SMALLEST = [
    ("llama-3.1-70b", "HGX-B200", None, 2, 2, 1, False, 1),  # 141 GB + 128k of KV: two GPUs
    ("llama-3.1-70b", "HGX-B200", 16384, 1, 1, 1, False, 1),
    ("llama-3.1-70b", "GB200-NVL72", None, 2, 2, 1, False, 1),
    ("llama-3.1-70b", "H100", None, 4, 4, 1, False, 1),
    ("deepseek-v3", "HGX-B200", None, 8, 1, 8, True, 1),  # 671 GB: one node, wide EP as the seeds
    ("deepseek-v3", "GB200-NVL72", None, 8, 1, 8, True, 2),  # one 4-GPU tray does not fit: two trays
    ("deepseek-r1", "GB200-NVL72", None, 8, 1, 8, True, 2),
    ("nvidia/DeepSeek-R1-FP4", "GB200-NVL72", 32768, 4, 1, 4, True, 1),  # the example's tray
    ("deepseek-v3", "H100", None, 16, 1, 16, True, 2),  # two H100 nodes: a LeaderWorkerSet group
    ("llama-3.1-8b", "GB200-NVL72", None, 1, 1, 1, False, 1),
]


@pytest.mark.parametrize(("model", "topology", "length", "gpus", "tp", "dp", "ep", "pods"), SMALLEST)
def test_smallest_fit(
    model: str, topology: str, length: int | None, gpus: int, tp: int, dp: int, ep: bool, pods: int
) -> None:
    topo, spec = resolve_topology(topology), resolve_model(model)
    fit = smallest_fit(spec, topo, length)
    assert fit is not None and fit.fits
    assert (fit.gpus, fit.tp, fit.dp, fit.expert_parallel) == (gpus, tp, dp, ep)
    assert pods_per_replica(topo, fit.gpus) == pods
    smaller = [n for n in replica_sizes(topo) if n < gpus]
    assert not any(
        replica_fit(spec, topo.gpu, t, d, e, length).fits for n in smaller for t, d, e in layouts(spec, topo, n)
    )
    assert fit.spec_fields() == {"gpusPerReplica": gpus, "tensorParallelSize": tp, "dataParallelSize": dp,
                                 "expertParallel": ep}  # fmt: skip


def test_a_bf16_deepseek_spans_nodes_and_nothing_fits_a_huge_cache() -> None:
    bf16 = quantized(resolve_model("deepseek-v3"), "bf16")
    fit = smallest_fit(bf16, resolve_topology("HGX-B200"))
    assert fit is not None and (fit.gpus, fit.dp, fit.expert_parallel) == (16, 16, True)
    nvl72 = smallest_fit(bf16, resolve_topology("GB200-NVL72"))
    assert nvl72 is not None and nvl72.gpus == 12  # three trays
    dense = resolve_model("llama-3.1-70b")
    assert smallest_fit(dense, resolve_topology("HGX-B200"), kv_bytes_per_token=10**9) is None


def test_spec_line_pastes_into_a_pool() -> None:
    fit = replica_fit(resolve_model("deepseek-v3"), resolve_topology("GB200-NVL72").gpu, 1, 8, True)
    assert fit.spec_line() == "gpusPerReplica: 8, tensorParallelSize: 1, dataParallelSize: 8, expertParallel: true"


@pytest.mark.parametrize(
    ("topology", "gpus", "want"),
    [
        ("HGX-B200", 4, "one pod: 4 of one HGX-B200 node's 8 GPUs"),
        ("HGX-B200", 24, "3 HGX-B200 nodes of 8 GPUs across 3 NVLink domains: a LeaderWorkerSet group of 3 pods"),
        ("GB200-NVL72", 4, "one pod: 4 of one GB200-NVL72 tray's 4 GPUs"),
        ("GB200-NVL72", 8, "2 GB200-NVL72 trays of 4 GPUs in one NVLink domain: a LeaderWorkerSet group of 2 pods"),
        ("GB200-NVL72", 72, "18 GB200-NVL72 trays of 4 GPUs in one NVLink domain: a LeaderWorkerSet group of 18 pods"),
    ],
)
def test_span(topology: str, gpus: int, want: str) -> None:
    assert span(resolve_topology(topology), gpus) == want


LAYOUTS = [(g, dp) for g in (1, 4, 6, 8, 12, 16, 24, 72, 76, 80) for dp in (1, 2, 3, 8, 16)]


@pytest.mark.parametrize("kind", rules.TOPOLOGY_KINDS[:-1])
def test_layout_problem_mirrors_the_api(kind: str) -> None:
    """The API's rules (xpyd_api.rules.check_spec) and plan's mirror of them refuse the same layouts."""
    for gpus, dp in LAYOUTS:
        try:
            rules.check_spec("Colocated", kind, {"worker": (gpus, dp)})
            api = None
        except rules.SpecError as exc:
            api = str(exc)
        mine = layout_problem(TOPOLOGIES[kind], gpus, dp)
        assert (api is None) == (mine is None), (gpus, dp, api, mine)
