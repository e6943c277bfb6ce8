"""The handoff facts: what the engine revision covers, and the pre-flight check refusing pairs that cannot hand KV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fakekube import OWNER, b200_nodes, spec  # type: ignore[import-not-found]

from xpyd_api import handoff
from xpyd_api import labels as L
from xpyd_api.models import DisaggregatedDeploymentSpec
from xpyd_operator import render, rollout
from xpyd_operator.desired import Observed, desire

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
    "topology": {"kind": "HGX-B200"},
    "engine": {"image": "vllm/vllm-openai:v0.34.0", "args": ["--max-model-len", "32768"]},
    "prefill": {"replicas": 1, "gpusPerReplica": 4},
    "decode": {"replicas": 1, "gpusPerReplica": 4},
}


def _spec(engine: dict[str, Any] | None = None, **pools: dict[str, Any]) -> DisaggregatedDeploymentSpec:
    body = {**BASE, "engine": {**BASE["engine"], **(engine or {})}}
    for role, extra in pools.items():
        body[role] = {**BASE[role], **extra}
    return DisaggregatedDeploymentSpec.model_validate(body)


def _rev(s: DisaggregatedDeploymentSpec, role: str = "decode") -> str:
    pool = s.pools()[role]
    return rollout.engine_rev(s.engine.image or "", s.engine.kv_connector, handoff.pool_facts(s, pool))


# What changes the revision (a spec edit that changes what crosses the handoff) and what does not.
@pytest.mark.parametrize(
    ("engine", "pool", "moves"),
    [
        ({"image": "vllm/vllm-openai:v0.33.0"}, {}, True),
        ({"version": "0.33.0", "image": "registry.local/vllm:custom"}, {}, True),
        ({"kvConnector": "MooncakeConnector"}, {}, True),
        ({"args": ["--max-model-len", "32768", "--block-size", "128"]}, {}, True),
        ({"args": ["--max-model-len", "32768", "--block-size=64"]}, {}, True),
        ({"args": ["--max-model-len", "32768", "--kv-cache-dtype", "fp8"]}, {}, True),
        ({"args": ["--max-model-len", "32768", "--dtype", "bfloat16"]}, {}, True),
        ({"args": ["--max-model-len", "32768", "--attention-backend", "FLASHINFER"]}, {}, True),
        ({"env": [{"name": handoff.LAYOUT_ENV, "value": "HND"}]}, {}, True),
        ({}, {"args": ["--tensor-parallel-size", "2"]}, True),
        ({}, {"args": ["-tp", "2"]}, True),
        ({}, {"gpusPerReplica": 8}, True),
        ({}, {"args": ["--pipeline-parallel-size", "2"]}, True),
        ({}, {"podTemplatePatch": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}}}, True),
        # not the handoff's business
        ({"args": ["--max-model-len", "32768", "--max-num-seqs", "64"]}, {}, False),
        ({"args": ["--max-model-len", "16384"]}, {}, False),
        ({}, {"args": ["--max-num-batched-tokens", "4096"]}, False),
        ({}, {"replicas": 3}, False),
        ({}, {"args": ["--kv-cache-dtype", "auto"]}, False),  # auto is the default
        ({}, {"args": ["--tensor-parallel-size", "4"]}, False),  # what the spec renders already
    ],
)
def test_the_revision_moves_with_the_handoff_facts_only(
    engine: dict[str, Any], pool: dict[str, Any], moves: bool
) -> None:
    before, after = _spec(), _spec(engine, decode=pool)
    assert (_rev(before) != _rev(after)) is moves


def test_the_model_and_topology_are_facts_too() -> None:
    other = DisaggregatedDeploymentSpec.model_validate({**BASE, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}})
    assert _rev(other) != _rev(_spec())
    gb200 = DisaggregatedDeploymentSpec.model_validate({**BASE, "topology": {"kind": "GB200-NVL72"}})
    assert _rev(gb200) != _rev(_spec())


def test_the_rendered_pods_carry_the_revision_of_their_facts() -> None:
    s = spec(engine={"args": ["--block-size", "128"]})
    out = desire(OWNER, s, Observed(nodes=b200_nodes(8)), "xpyd:dev", "xpyd:dev")
    assert out.error is None
    labels = {m["metadata"]["name"]: m["spec"]["template"]["metadata"]["labels"] for m in out.children
              if m["kind"] == "StatefulSet"}  # fmt: skip
    assert labels["llama-prefill"][L.ENGINE_REV] == labels["llama-decode"][L.ENGINE_REV]
    plain = desire(OWNER, spec(), Observed(nodes=b200_nodes(8)), "xpyd:dev", "xpyd:dev")
    plain_labels = {m["metadata"]["name"]: m["spec"]["template"]["metadata"]["labels"] for m in plain.children
                    if m["kind"] == "StatefulSet"}  # fmt: skip
    assert plain_labels["llama-decode"][L.ENGINE_REV] != labels["llama-decode"][L.ENGINE_REV]


def test_the_facts_read_the_command_line_as_the_engine_does() -> None:
    s = _spec({"args": ["--block_size", "32", "--kv-cache-dtype", "fp8_e4m3"]}, decode={"args": ["--block-size", "64"]})
    prefill, decode = handoff.pool_facts(s, s.pools()["prefill"]), handoff.pool_facts(s, s.pools()["decode"])
    assert (prefill.block_size, decode.block_size) == ("32", "64"), "the pool's args come last and win"
    assert prefill.kv_cache_dtype == decode.kv_cache_dtype == "fp8_e4m3"
    assert (prefill.version, prefill.tp, prefill.gpu) == ("0.34.0", 4, "NVIDIA-B200")
    sglang = DisaggregatedDeploymentSpec.model_validate(
        {
            **BASE,
            "engine": {"kind": "sglang", "args": ["--page-size", "32"]},
            "prefill": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 4},
            "decode": {"replicas": 1, "gpusPerReplica": 8, "dataParallelSize": 4},
        }
    )
    facts = handoff.pool_facts(sglang, sglang.pools()["decode"])
    assert (facts.block_size, facts.tp, facts.dp, facts.version) == ("32", 2, 4, "0.5.23")
    assert handoff.check(sglang) is None


# Each pair the pre-flight check refuses, and the words its message must name.
@pytest.mark.parametrize(
    ("engine", "prefill", "decode", "words"),
    [
        ({}, {"args": ["--block-size", "16"]}, {"args": ["--block-size", "128"]}, ["block size differs", "16", "128"]),
        ({"kind": "sglang", "image": None}, {"args": ["--page-size", "1"]}, {"args": ["--page-size", "64"]},
         ["block size differs", "prefill 1, decode 64"]),
        ({}, {"args": ["--kv-cache-dtype", "fp8"]}, {}, ["KV cache dtype differs", "prefill fp8, decode default"]),
        ({}, {}, {"args": ["--dtype", "float16"]}, ["model dtype"]),
        ({}, {"args": ["--attention-backend", "FLASHINFER"]}, {}, ["attention backend differs"]),
        ({}, {"gpusPerReplica": 8}, {"gpusPerReplica": 4}, ["prefill tensor parallel 8 > decode tensor parallel 4",
                                                             "Decode TP cannot be smaller"]),
        ({}, {"args": ["-tp", "3"]}, {},
         ["decode tensor parallel 4 is not a multiple of prefill tensor parallel 3"]),
        ({}, {"gpusPerReplica": 8, "pipelineParallelSize": 2}, {"gpusPerReplica": 8, "pipelineParallelSize": 2},
         ["pipeline parallel (prefill PP2, decode PP2)", "NixlConnector"]),
        ({}, {"gpusPerReplica": 8, "pipelineParallelSize": 2}, {"gpusPerReplica": 8, "tensorParallelSize": 4,
                                                                  "pipelineParallelSize": 2},
         ["pipeline parallel"]),
        ({}, {}, {"podTemplatePatch": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}}}},
         ["GPU type differs", "prefill NVIDIA-B200, decode NVIDIA-H100"]),
        ({}, {}, {"podTemplatePatch": {"spec": {"containers": [{"name": "engine",
                                                                "image": "vllm/vllm-openai:v0.33.0"}]}}},
         ["engine image differs"]),
        ({}, {"podTemplatePatch": {"spec": {"containers": [{"name": "engine", "env": [
            {"name": handoff.LAYOUT_ENV, "value": "HND"}]}]}}}, {}, ["KV cache layout"]),
        ({}, {"args": ["-tp", "two"]}, {}, ["cannot read the handoff facts", "'two' is not an integer"]),
    ],
)  # fmt: skip
def test_the_preflight_check_refuses_pairs_that_cannot_hand_kv_over(
    engine: dict[str, Any], prefill: dict[str, Any], decode: dict[str, Any], words: list[str]
) -> None:
    s = _spec(engine, prefill=prefill, decode=decode)
    message = handoff.check(s)
    assert message is not None
    for word in words:
        assert word in message, message
    if "cannot read" not in message:
        assert "[prefill: " in message and "; decode: " in message, "the message names both sides' facts"


def test_a_refused_pair_is_ready_false_and_touches_nothing() -> None:
    s = spec(decode={"replicas": 4, "gpusPerReplica": 8, "args": ["--block-size", "64"]})
    out = desire(OWNER, s, Observed(nodes=b200_nodes(8)), "xpyd:dev", "xpyd:dev")
    assert out.children == [] and out.error is not None
    reason, message = out.error
    assert reason == handoff.REASON == "HandoffIncompatible"
    assert "block size differs (prefill default, decode 64)" in message


def test_a_decode_tp_that_is_a_multiple_of_prefills_pairs_and_moves_both_revisions() -> None:
    """vLLM reads a TP2 prefill's KV into a TP4 decode: accepted, both pools on one revision; a TP edit of
    either pool moves both, so no worker of the old pair is paired with one of the new."""
    s = _spec(prefill={"args": ["-tp", "2"]})
    assert handoff.check(s) is None
    assert _rev(s, "prefill") == _rev(s, "decode")
    edited = _spec(prefill={"args": ["-tp", "1"]})
    assert handoff.check(edited) is None
    assert _rev(edited, "prefill") == _rev(edited, "decode") != _rev(s, "decode")


def test_equal_pools_and_colocated_mode_pass() -> None:
    assert handoff.check(_spec()) is None
    assert handoff.check(_spec({"args": ["--block-size", "128", "--kv-cache-dtype", "fp8"]})) is None
    dp = {"gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}
    assert handoff.check(_spec(prefill=dp, decode={**dp, "gpusPerReplica": 16, "dataParallelSize": 16})) is None
    colocated = DisaggregatedDeploymentSpec.model_validate(
        {
            "model": BASE["model"],
            "mode": "Colocated",
            "worker": {"replicas": 1, "gpusPerReplica": 4, "args": ["--block-size", "64"]},
        }
    )
    assert handoff.check(colocated) is None


def _shipped() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == L.KIND:
                out.append((f"{path.relative_to(REPO).as_posix()}:{doc['metadata']['name']}", doc))
    return out


@pytest.mark.parametrize(("name", "doc"), _shipped(), ids=[n for n, _ in _shipped()])
def test_every_shipped_example_hands_kv_over(name: str, doc: dict[str, Any]) -> None:
    s = DisaggregatedDeploymentSpec.model_validate(doc["spec"])
    assert handoff.check(s) is None, name
    _, children = render.render_objects(doc, render.Options())
    assert children, name


def test_render_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    decode = {"replicas": 1, "gpusPerReplica": 4, "args": ["--kv-cache-dtype", "fp8"]}
    doc = {"apiVersion": f"{L.GROUP}/{L.VERSION}", "kind": L.KIND, "metadata": {"name": "mixed"},
           "spec": {**BASE, "decode": decode}}  # fmt: skip
    path = tmp_path / "dd.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert render.main([str(path)]) == render.EXIT_INPUT
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "Ready=False, HandoffIncompatible" in captured.err and "KV cache dtype differs" in captured.err


# The newest vLLM's own handshake rules (what the emulator answers a decode with).
def _facts(**kw: Any) -> handoff.HandoffFacts:
    return handoff.HandoffFacts(**{"kind": "vllm", "version": "", "image": "-", "connector": "NixlConnector",
                                   "model": "m", **kw})  # fmt: skip


@pytest.mark.parametrize(
    ("prefill", "decode", "refusal"),
    [
        ({}, {}, None),
        ({"tp": 2}, {"tp": 4}, None),
        ({"tp": 4}, {"tp": 2}, None),
        ({"tp": 2}, {"tp": 3}, "not divisible by remote tensor parallel size 2"),
        ({"tp": 3}, {"tp": 2}, "Remote tensor parallel size 3 is not divisible"),
        ({"block_size": "16"}, {"block_size": "64"}, None),
        ({"block_size": "64"}, {"block_size": "16"}, "Local block size 16 is not divisible by remote block size 64"),
        ({"block_size": "16", "tp": 4}, {"block_size": "64", "tp": 2}, "not supported when P TP > D TP"),
        ({"kv_cache_dtype": "fp8"}, {}, "NIXL compatibility hash mismatch"),
        ({"model": "other"}, {}, "NIXL compatibility hash mismatch"),
        ({"connector": "MooncakeConnector"}, {}, "cannot hand KV"),
    ],
)
def test_the_engine_refuses_as_vllm_does(prefill: dict[str, Any], decode: dict[str, Any], refusal: str | None) -> None:
    found = handoff.engine_refusal(_facts(**prefill), _facts(**decode))
    assert (found is None) if refusal is None else (found is not None and refusal in found), found


def test_emulated_pods_know_their_revision_by_the_downward_api() -> None:
    s = spec(engine={"kind": "emulator"})
    out = desire(OWNER, s, Observed(nodes=b200_nodes(8)), "xpyd:dev", "xpyd:dev")
    pods = [m["spec"]["template"] for m in out.children if m["kind"] == "StatefulSet"]
    for pod in pods:
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        ref = env[L.ENV_ENGINE_REV]["valueFrom"]["fieldRef"]["fieldPath"]
        assert ref == f"metadata.labels['{L.ENGINE_REV}']" and L.ENGINE_REV in pod["metadata"]["labels"]
    vllm = desire(OWNER, spec(), Observed(nodes=b200_nodes(8)), "xpyd:dev", "xpyd:dev")
    for m in vllm.children:
        if m["kind"] == "StatefulSet":
            assert L.ENV_ENGINE_REV not in {e["name"] for e in m["spec"]["template"]["spec"]["containers"][0]["env"]}
