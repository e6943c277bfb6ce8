"""`xpyd plan`: JSON fields, the table, the trace length mix, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpyd_perf.cli import main
from xpyd_perf.lengthmix import TraceFormatError, parse_lengths


def test_json_has_the_break_even_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--model", "llama-3.1-70b", "--topology", "HGX-B200", "--prompt-tokens", "32768", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["kv_bytes"] == 32768 * 327_680
    assert doc["disaggregate"] is True
    assert doc["transfer_seconds"] < doc["stall_seconds"] <= doc["prefill_seconds"]
    assert doc["suggestion"]["xpyd"].endswith("D")


def test_table_lists_each_prompt_length(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "llama-3.1-70b", "--topology", "GB200-NVL72", "--prompt-tokens", "2048,131072"]) == 0
    out = capsys.readouterr().out
    assert "2048" in out
    assert "131072" in out
    assert "NVLink" in out
    assert "suggested" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "valid models: llama-3.1-8b"),
        (["--model", "llama-3.1-8b", "--topology", "TPU"], "valid topologies: HGX-B200"),
        (["--model", "llama-3.1-8b", "--prompt-tokens", "lots"], "not an integer"),
        (["--model", "llama-3.1-8b", "--trace", "/nonexistent/trace.jsonl"], "No such file"),
    ],
)
def test_errors_are_clear(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_trace_length_mix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [
        json.dumps({"timestamp": i, "input_length": n, "output_length": 100})
        for i, n in enumerate([64, 64, 8000, 30000])
    ]
    trace.write_text("\n".join(lines) + "\n")
    assert main(["--model", "llama-3.1-70b", "--trace", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["tag"] for r in doc["rows"]] == ["p50", "mean", "p90", "p99"]
    assert doc["prompt_tokens"] == round((64 + 64 + 8000 + 30000) / 4)
    assert doc["trace_disaggregate_share"] == 0.5
    assert doc["suggestion"]["output_tokens"] == 100


def test_parse_azure_csv_and_bad_traces() -> None:
    mix = parse_lengths(["TIMESTAMP,ContextTokens,GeneratedTokens", "t,374,44", "t,396,109"])
    assert mix.prompts == (374, 396)
    assert mix.mean_output == 76
    with pytest.raises(TraceFormatError, match="ContextTokens"):
        parse_lengths(["a,b", "1,2"])
    with pytest.raises(TraceFormatError, match="line 2"):
        parse_lengths(['{"input_length": 1, "output_length": 1}', '{"input_length": 1}'])
    with pytest.raises(TraceFormatError, match="empty"):
        parse_lengths([])
