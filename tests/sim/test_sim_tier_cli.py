"""`xpyd simulate`'s KV-offloading flags (--offload-bytes, --offload-decode, --no-tier-pricing,
--cpu-tier-weight) and the report's split of the prefix hit ratio into the GPU and the CPU tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_sim_dp_ranks import chat  # type: ignore[import-not-found]  # tests/sim on sys.path
from test_sim_tiers import LLAMA_8B  # type: ignore[import-not-found]

from xpyd_sim import spec as specs
from xpyd_sim.cli import build_parser, main
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.report import build

BASE = ["--spec", "x.yaml", "--trace", "t.jsonl"]


@pytest.mark.parametrize(
    ("argv", "size", "decode", "pricing"),
    [
        ([], 0, False, True),
        (["--offload-bytes", "200Gi"], 200 << 30, False, True),
        (["--offload-bytes", "64G", "--offload-decode"], 64 * 10**9, True, True),
        (["--offload-bytes", "1000000", "--no-tier-pricing"], 1_000_000, False, False),
        (["--offload-bytes", "1.5Ti"], int(1.5 * (1 << 40)), False, True),
    ],
)
def test_offload_flags_parse(argv: list[str], size: int, decode: bool, pricing: bool) -> None:
    args = build_parser().parse_args([*BASE, *argv])
    assert (args.offload_bytes, args.offload_decode, args.tier_pricing) == (size, decode, pricing)


@pytest.mark.parametrize(("argv", "weight"), [([], None), (["--cpu-tier-weight", "0.4"], 0.4)])
def test_the_fixed_cpu_weight_flag_parses(argv: list[str], weight: float | None) -> None:
    assert build_parser().parse_args([*BASE, *argv]).cpu_block_weight == weight


@pytest.mark.parametrize("bad", ["0", "1.5", "nan"])
def test_a_fixed_cpu_weight_outside_0_1_is_refused(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(LLAMA_8B))
    argv = ["--spec", str(spec), "--trace", str(_trace(tmp_path / "chat.jsonl")), "--cpu-tier-weight", bad]
    assert main(argv) == 2
    assert "--cpu-tier-weight must be more than 0 and at most 1" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["lots", "12Qi", "-5G", ""])
def test_a_bad_offload_size_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, "--offload-bytes", bad])
    assert "--offload-bytes" in capsys.readouterr().err


def _trace(path: Path) -> Path:
    """The chat test trace as a Mooncake file: its hash ids cover 512 tokens each."""
    lines = [
        json.dumps({"timestamp": int(r.arrival * 1000), "input_length": len(r.blocks) * 512 + 20,
                    "output_length": r.output_tokens, "hash_ids": list(r.blocks)})
        for r in chat()
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(LLAMA_8B))
    trace = _trace(tmp_path / "chat.jsonl")
    # a small GPU cache, so the chat's history leaves it; KV events feed the router's index
    argv = ["--spec", str(spec), "--trace", str(trace), "--cache-tokens", str(40 * 512), "--json", *flags]
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_the_flags_reach_the_run_and_the_report_splits_the_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _cli(tmp_path, capsys)
    tiered = _cli(tmp_path, capsys, "--offload-bytes", "64Gi")
    assert plain["reloaded_tokens"] == 0 and plain["cpu_hit_ratio"] == 0.0
    assert plain["gpu_hit_ratio"] == plain["prefix_hit_ratio"]
    assert tiered["reloaded_tokens"] > 0 and tiered["cpu_hit_ratio"] > 0.0
    assert tiered["prefix_hit_ratio"] > plain["prefix_hit_ratio"]
    assert tiered["gpu_hit_ratio"] + tiered["cpu_hit_ratio"] == pytest.approx(tiered["prefix_hit_ratio"], abs=2e-4)


def test_the_report_counts_every_reloaded_token() -> None:
    cfg = SimConfig(router="kv-aware", block_tokens=64, cache_tokens=40 * 64, offload_bytes=64 << 30)
    sim = Simulation(specs.parse(LLAMA_8B), chat(), cfg)
    seen: list[int] = []
    sim.on_finish = lambda req: seen.append(req.reloaded_tokens)
    sim.run()
    res = build(sim, 0.0)
    assert res["reloaded_tokens"] == sum(seen) == sum(w.reloaded for w in sim.cluster.all_workers()) > 0
