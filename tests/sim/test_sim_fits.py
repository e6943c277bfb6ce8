"""`xpyd simulate` refuses what the operator refuses, agrees with `xpyd plan`, and places multi-node replicas whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import DisaggregatedDeployment, DisaggregatedDeploymentSpec
from xpyd_operator import sizing
from xpyd_operator.desired import InputError, check_fit
from xpyd_perf import resolve_model, resolve_topology
from xpyd_perf.cli import main as plan
from xpyd_sim.cli import main as simulate
from xpyd_sim.cluster import Cluster
from xpyd_sim.perfmodel import PoolPerf
from xpyd_sim.spec import SimSpec, SpecError, parse, replica_fits

TRACE = "synthetic:rate=2,duration=10,prompt=1024,output=16"


def pool(gpus: int, replicas: int = 1, wide_ep: bool = False) -> dict[str, Any]:
    """A pool: tensor parallel over its GPUs, or wide expert parallel (TP1 x DP=GPUs, EP on)."""
    out: dict[str, Any] = {"replicas": replicas, "gpusPerReplica": gpus}
    return {**out, "dataParallelSize": gpus, "expertParallel": True} if wide_ep else out


def doc(model: str, topology: str, prefill: dict[str, Any], decode: dict[str, Any], *args: str) -> dict[str, Any]:
    return {
        "apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment", "metadata": {"name": "dd"},
        "spec": {"model": {"name": model}, "topology": {"kind": topology}, "engine": {"args": list(args)},
                 "prefill": prefill, "decode": decode},
    }  # fmt: skip


# (model, topology, prefill, decode, engine args, fits): the seed deployments' models on both systems.
CASES = [
    ("deepseek-ai/DeepSeek-V3", "GB200-NVL72", pool(4), pool(4), (), False),  # 671 GB on one tray
    ("deepseek-ai/DeepSeek-V3", "GB200-NVL72", pool(4, wide_ep=True), pool(8, wide_ep=True), (), False),
    ("deepseek-ai/DeepSeek-V3", "GB200-NVL72", pool(8, wide_ep=True), pool(8, wide_ep=True), (), True),  # 2 trays
    ("deepseek-ai/DeepSeek-R1-0528", "HGX-B200", pool(8, wide_ep=True), pool(16, wide_ep=True), (), True),
    ("deepseek-ai/DeepSeek-V3", "HGX-B200", pool(4), pool(8), (), False),
    ("nvidia/DeepSeek-R1-FP4", "GB200-NVL72", pool(4, wide_ep=True), pool(4, wide_ep=True),
     ("--kv-cache-dtype", "fp8", "--max-model-len", "32768"), True),
    ("meta-llama/Llama-3.1-70B-Instruct", "HGX-B200", pool(1), pool(1), (), False),  # 128k context on one GPU
    ("meta-llama/Llama-3.1-70B-Instruct", "HGX-B200", pool(1), pool(1), ("--max-model-len", "16384"), True),
    ("meta-llama/Llama-3.1-70B-Instruct", "HGX-B200", pool(2), pool(4), (), True),
    ("meta-llama/Llama-3.1-70B-Instruct", "GB200-NVL72", pool(4), pool(8), (), True),
]  # fmt: skip
IDS = [f"{c[0].split('/')[1]}-{c[1]}-{c[2]['gpusPerReplica']}-{c[3]['gpusPerReplica']}-{len(c[4])}" for c in CASES]


def typed(d: dict[str, Any]) -> DisaggregatedDeploymentSpec:
    return DisaggregatedDeployment.model_validate(d).spec


def operator_verdict(d: dict[str, Any]) -> str | None:
    """The message of the operator's Ready=False, ReplicaDoesNotFit condition, or None when it accepts."""
    try:
        check_fit(typed(d))
    except InputError as exc:
        return exc.message if exc.reason == "ReplicaDoesNotFit" else f"other reason {exc.reason}"
    return None


@pytest.mark.parametrize(("model", "topology", "prefill", "decode", "args", "fits"), CASES, ids=IDS)
def test_simulate_refuses_what_the_operator_refuses(
    model: str, topology: str, prefill: dict[str, Any], decode: dict[str, Any], args: tuple[str, ...], fits: bool,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    d = doc(model, topology, prefill, decode, *args)
    (tmp_path / "dd.yaml").write_text(yaml.safe_dump(d))
    rc = simulate(["--spec", str(tmp_path / "dd.yaml"), "--trace", TRACE, "--json", "--no-progress"])
    out, err = capsys.readouterr()
    refused = operator_verdict(d)
    assert (refused is None) is fits
    if refused is None:
        assert rc == 0 and err == ""
        row = json.loads(out)
        assert row["completed"] > 0
        assert row["replica_fit"] == {r: f.summary() for r, f in replica_fits(parse(d)).items()}
    else:
        assert rc == 2 and out == ""
        assert err == f"xpyd simulate: dd: the operator would refuse it (Ready=False, ReplicaDoesNotFit): {refused}\n"


def plan_flags(d: dict[str, Any], role: str) -> list[str]:
    """The `xpyd plan` flags of one pool of a spec: the same model, topology, layout and engine flags."""
    spec, p = d["spec"], d["spec"][role]
    out = ["--model", spec["model"]["name"], "--topology", spec["topology"]["kind"]]
    out += ["--gpus-per-replica", str(p["gpusPerReplica"]), "--data-parallel-size", str(p.get("dataParallelSize", 1))]
    out += ["--expert-parallel"] if p.get("expertParallel") else []
    argv = spec["engine"]["args"]
    if "--max-model-len" in argv:
        out += ["--max-model-len", argv[argv.index("--max-model-len") + 1]]
    if "--kv-cache-dtype" in argv:  # an FP8 KV cache halves the catalog's bytes per token, as the operator does
        out += ["--kv-bytes-per-token", str(resolve_model(spec["model"]["name"]).kv_bytes_per_token // 2)]
    return out


@pytest.mark.parametrize(("model", "topology", "prefill", "decode", "args", "fits"), CASES, ids=IDS)
def test_plan_and_simulate_print_the_same_verdict(
    model: str, topology: str, prefill: dict[str, Any], decode: dict[str, Any], args: tuple[str, ...], fits: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    d = doc(model, topology, prefill, decode, *args)
    spec = SimSpec.of("dd", typed(d), resolve_model(model), resolve_topology(topology))
    for role, fit in replica_fits(spec).items():
        rc = plan([*plan_flags(d, role), "--prompt-tokens", "2048"])
        out, err = capsys.readouterr()
        assert rc == (0 if fit.fits else 2)
        assert f"replica: {fit.summary()}" in out.splitlines() if fit.fits else fit.summary() in err
        assert sizing.replica_fit_of(spec.deployment, spec.deployment.pools()[role]) == fit  # the operator's


def test_an_override_is_checked_on_the_simulated_hardware() -> None:
    d = doc("meta-llama/Llama-3.1-70B-Instruct", "HGX-B200", pool(2), pool(2))
    assert parse(d).topology.name == "HGX-B200"
    with pytest.raises(SpecError, match=r"prefill: llama-3.1-70b .* on 2 x H100 \(TP2\).*does not fit"):
        parse(d, gpu="H100")  # 141 GB of weights on 2 x 80 GB
    with pytest.raises(SpecError, match="must be <= 8 or a multiple of 8 on HGX-B200"):
        parse(doc("meta-llama/Llama-3.1-70B-Instruct", "GB200-NVL72", pool(12), pool(4)), topology="HGX-B200")


def sim_spec(topology: str, prefill: dict[str, Any], decode: dict[str, Any]) -> SimSpec:
    return parse(doc("deepseek-ai/DeepSeek-V3", topology, prefill, decode))


def cluster(spec: SimSpec) -> Cluster:
    perfs = {r: PoolPerf(spec.model, spec.topology.gpu, p.tp, p.gpus, None, p.expert_parallel)
             for r, p in spec.pools.items()}  # fmt: skip
    return Cluster(spec, perfs, token_budget=8192, max_seqs=64, block_tokens=512)


def test_hgx_groups_take_whole_nodes() -> None:
    spec = sim_spec("HGX-B200", pool(16, 2, wide_ep=True), pool(8, 3, wide_ep=True))
    c = cluster(spec)
    assert (c.pods("prefill"), c.pods("decode")) == (2, 1)
    # interleaved D, P, D, P, D: each 16-GPU group on two empty nodes, named after its leader's
    assert [w.domain for w in c.workers["prefill"]] == ["node-1", "node-4"]
    assert [w.domain for w in c.workers["decode"]] == ["node-0", "node-3", "node-6"]
    assert c.domain_used == [8] * 7
    c.retire(c.workers["prefill"][0], 1.0)
    assert c.domain_used == [8, 0, 0, 8, 8, 8, 8]
    w = c.add("prefill", 2.0, ready=False)  # the autoscaler adds a whole group: two free nodes, 16 GPUs
    assert (w.domain, w.gpus, c.domain_used) == ("node-1", 16, [8] * 7)


def test_nvl72_groups_stay_inside_one_clique() -> None:
    spec = sim_spec("GB200-NVL72", pool(16, 4, wide_ep=True), pool(8, 1, wide_ep=True))
    c = cluster(spec)
    assert c.domain_used == [72] and c.pods("prefill") == 4
    w = c.add("prefill", 1.0, ready=True)  # no room left in clique-0: the whole group goes to the next one
    assert (w.domain, c.domain_used) == ("clique-1", [72, 16])
    c.retire(c.workers["decode"][0], 2.0)
    assert c.add("decode", 3.0, ready=True).domain == "clique-0"


def test_a_replica_is_priced_over_all_its_gpus() -> None:
    """A wide-EP replica is one engine of all its GPUs (as `xpyd plan` prices it), its KV the HBM its weights leave."""
    model, gpu = resolve_model("deepseek-v3"), resolve_topology("HGX-B200").gpu
    wide, tp8 = PoolPerf(model, gpu, 1, 8, None, True), PoolPerf(model, gpu, 8, 8)
    assert wide.decode_step_seconds(64, 64 * 4096) == tp8.decode_step_seconds(64, 64 * 4096)
    assert wide.kv_capacity_tokens < tp8.kv_capacity_tokens  # the dense layers are on every rank
    assert PoolPerf(model, gpu, 1, 16, None, True).kv_capacity_tokens > 2 * wide.kv_capacity_tokens
