"""The engine flags the operator renders per release, and vLLM's min_tokens check, as the emulator reads them."""

from __future__ import annotations

import shlex
from typing import Any

import orjson
import pytest

from xpyd_emulator.cmdline import CommandLineError, parse_engine_command
from xpyd_emulator.errors import ApiError
from xpyd_emulator.protocol import parse_request

VLLM = "vllm serve m --port 8000 "
SGL = "python3 -m sglang.launch_server --model-path m --port 30000 "


def _kv(role: str) -> str:
    return shlex.quote(orjson.dumps({"kv_connector": "NixlConnector", "kv_role": role}).decode())


@pytest.mark.parametrize(
    ("command", "want"),
    [
        (VLLM + f"--kv-transfer-config {_kv('kv_producer')}", {"kv_role": "kv_producer"}),  # vLLM 0.33 prefill
        (VLLM + f"--kv-transfer-config {_kv('kv_consumer')}", {"kv_role": "kv_consumer"}),  # and decode
        (VLLM + f"--kv-transfer-config {_kv('kv_both')}", {"kv_role": "kv_both"}),  # older releases
        (VLLM + "-dp 2 --enable-expert-parallel --all2all-backend deepep_high_throughput", {"a2a": "high_throughput"}),
        (VLLM + "-dp 2 --enable-expert-parallel --all2all-backend deepep_low_latency", {"a2a": "low_latency"}),
        (VLLM + "-dp 2 --enable-expert-parallel --all2all-backend allgather_reducescatter", {"a2a": "low_latency"}),
        (VLLM + "-dp 2 --enable-expert-parallel --all2all-backend mori_high_throughput", {"a2a": "high_throughput"}),
        (VLLM + "--all2all-backend passthrough", {"dp": 1}),
        (VLLM + "--moe-backend flashinfer_cutlass", {"dp": 1}),
        (VLLM + "--moe-backend DEEP-GEMM", {"dp": 1}),
        (SGL, {"metrics": False}),  # SGLang: /metrics only with --enable-metrics
        (SGL + "--enable-metrics", {"metrics": True}),
        (SGL + "--tp 8 --attn-dp-size 4", {"dp": 4, "dp_attention": True, "layout_tp": 2}),  # 0.5.23
        (SGL + "--tp 8 --dp-size 4 --enable-dp-attention", {"dp": 4, "dp_attention": True, "layout_tp": 2}),  # before
        (SGL + "--tp 8 --dp-size 4 --attn-dp-size 4", {"dp": 4, "dp_attention": True, "layout_tp": 2}),
        (SGL + "--tp 8 --attn-dp-size 1", {"dp": 1, "dp_attention": False, "layout_tp": 8}),
        (VLLM, {"metrics": True}),
    ],
)  # fmt: skip
def test_flags_each_release_renders_are_read(command: str, want: dict[str, Any]) -> None:
    cfg = parse_engine_command(shlex.split(command), {})
    got = {
        "kv_role": (cfg.kv_transfer_config or {}).get("kv_role"), "a2a": cfg.layout.a2a, "dp": cfg.dp,
        "dp_attention": cfg.dp_attention, "metrics": cfg.metrics, "layout_tp": cfg.layout.tp,
    }  # fmt: skip
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (VLLM + "--all2all-backend warp_drive", "invalid choice"),
        (SGL + "--tp 8 --dp-size 2 --attn-dp-size 4", "--attn-dp-size 4 with --dp-size 2"),
        (SGL + "--tp 6 --attn-dp-size 4", "not a multiple"),
        (SGL + "--attn-dp-size 0", "--attn-dp-size"),
    ],
)
def test_flags_the_engine_would_refuse(command: str, message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        parse_engine_command(shlex.split(command), {})


def _parse(body: dict[str, Any], chat: bool = False) -> Any:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hello there"}
    return parse_request(orjson.dumps({**base, **body}), chat=chat, served=["m"], max_model_len=1000, block_size=16,
                         hash_blocks=False, default_output_tokens=16)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "chat", "message"),
    [  # vllm/sampling_params.py SamplingParams._verify_args, word for word
        ({"max_tokens": 1, "min_tokens": 4}, False, "min_tokens must be less than or equal to max_tokens=1, got 4."),
        ({"min_tokens": 17}, False, "min_tokens must be less than or equal to max_tokens=16, got 17."),  # default 16
        ({"max_completion_tokens": 2, "min_tokens": 3}, True,
         "min_tokens must be less than or equal to max_tokens=2, got 3."),
        ({"min_tokens": -1}, False, "min_tokens must be greater than or equal to 0, got -1."),
        ({"min_tokens": "2"}, False, "min_tokens must be an integer"),
        ({"prompt": "x", "cache_salt": ""}, False, "cache_salt"),
    ],
)  # fmt: skip
def test_min_tokens_above_max_tokens_is_refused_as_vllm_does(body: dict[str, Any], chat: bool, message: str) -> None:
    with pytest.raises(ApiError) as err:
        _parse(body, chat)
    assert err.value.status == 400
    assert message in orjson.loads(err.value.body())["error"]["message"]


@pytest.mark.parametrize(
    ("body", "chat"),
    [
        ({"max_tokens": 5, "min_tokens": 5}, False),
        ({"max_tokens": 5, "min_tokens": 0}, False),
        ({"min_tokens": 500}, True),  # chat without max_tokens runs to the end of the context
        ({"max_tokens": 5, "min_completion_tokens": 9}, False),  # not a vLLM field: ignored, as vLLM does
    ],
)
def test_min_tokens_within_max_tokens_passes(body: dict[str, Any], chat: bool) -> None:
    assert _parse(body, chat).max_tokens >= 1
