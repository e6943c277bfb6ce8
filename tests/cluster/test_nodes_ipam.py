"""The local cluster's fake nodes and its loopback address allocator."""

from __future__ import annotations

import ipaddress

import pytest

from xpyd_cluster import nodes
from xpyd_cluster.cli import summarize
from xpyd_cluster.ipam import LoopbackIPAM, PoolExhausted


def test_nodes_match_the_topology_facts() -> None:
    all_nodes = nodes.all_nodes()
    b200 = [n for n in all_nodes if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-B200"]
    gb200 = [n for n in all_nodes if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-GB200"]
    assert len(b200) == nodes.HGX_NODES == 8
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in b200)
    assert len(gb200) == 36
    assert all(n["metadata"]["labels"]["kubernetes.io/arch"] == "arm64" for n in gb200)
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "4" for n in gb200)
    cliques = {n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in gb200}
    assert len(cliques) == 2
    assert all(
        ipaddress.ip_address(a["address"]).is_loopback
        for n in all_nodes
        for a in n["status"]["addresses"]
        if a["type"] == "InternalIP"
    )


def test_gpu_nodes_offer_the_rdma_slots_engine_pods_ask_for() -> None:
    for node in nodes.all_nodes():
        gpus = "nvidia.com/gpu" in node["status"]["allocatable"]
        assert (node["status"]["allocatable"].get("rdma/ib") == "64") is gpus


def test_clique_ids_are_stable_and_shaped_like_gfd() -> None:
    assert nodes.clique_id(0) == nodes.clique_id(0)
    uuid_part, clique = nodes.clique_id(1).split(".")
    assert clique == "1"
    assert len(uuid_part) == 36


def test_summary_counts_gpus_per_nvlink_domain() -> None:
    rows = summarize(nodes.all_nodes())
    assert ("HGX-B200", "per node", 8, 64) in rows
    assert [r[3] for r in rows if r[0] == "GB200-NVL72"] == [72, 72]
    assert ("CPU", "-", 1, 0) in rows


def test_ipam_never_hands_out_an_address_twice_and_stays_on_loopback() -> None:
    ipam = LoopbackIPAM(in_use=["127.1.0.1", "10.0.0.1"])
    got = [ipam.allocate() for _ in range(300)]
    assert len(set(got)) == 300
    assert "127.1.0.1" not in got
    assert all(ipaddress.ip_address(a).is_loopback and not a.endswith((".0", ".255")) for a in got)
    ipam.release(got[0])
    ipam.claim("127.1.9.9")
    assert "127.1.9.9" not in [ipam.allocate() for _ in range(10)]


def test_ipam_exhaustion_is_an_error() -> None:
    ipam = LoopbackIPAM()
    ipam._used = {str(a) for a in ipaddress.ip_network("127.1.0.0/16")}
    with pytest.raises(PoolExhausted, match="127.1.0.0/16"):
        ipam.allocate()
