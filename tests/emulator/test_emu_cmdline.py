"""Reading vLLM and SGLang command lines and the pod env into the emulator configuration."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from xpyd_emulator.cmdline import CommandLineError, parse_engine_command

KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


@pytest.mark.parametrize(
    ("command", "model", "port", "tp", "engine"),
    [
        (["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "--port", "8100", "-tp", "8"],
         "meta-llama/Llama-3.1-70B-Instruct", 8100, 8, "vllm"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--tensor-parallel-size=4"],
         "m", 8000, 4, "vllm"),
        (["--model", "m", "--port", "9000"], "m", 9000, 1, "vllm"),
        (["sh", "-c", "exec vllm serve m --port 8001 --tensor-parallel-size 2"], "m", 8001, 2, "vllm"),
        (["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "8",
          "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "8998"], "m", 30000, 8, "sglang"),
    ],
)  # fmt: skip
def test_command_forms(command: list[str], model: str, port: int, tp: int, engine: str) -> None:
    cfg = parse_engine_command(command, {})
    assert (cfg.model, cfg.port, cfg.tp, cfg.engine) == (model, port, tp, engine)


def test_flags_env_and_defaults() -> None:
    cmd = ["vllm", "serve", "m", "--host", "0.0.0.0", "--kv-transfer-config", KV, "--served-model-name", "a", "b",
           "--max-model-len", "4096", "--unknown-flag", "x", "--no-enable-prefix-caching"]  # fmt: skip
    env = {
        "XPYD_BIND_HOST": "127.0.0.7",
        "XPYD_NODE_NAME": "b200-0",
        "XPYD_NVLINK_DOMAIN": "clique-1",
        "XPYD_GPU": "GB200",
        "XPYD_SPEEDUP": "20",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
    }
    cfg = parse_engine_command(cmd, env)
    assert cfg.host == "127.0.0.7"
    assert cfg.side_channel_host == "127.0.0.7"
    assert cfg.side_channel_port == 5601
    assert cfg.kv_transfer_config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert cfg.served_model_names == ["a", "b"]
    assert (cfg.max_model_len, cfg.enable_prefix_caching) == (4096, False)
    assert (cfg.gpu, cfg.speedup, cfg.nvlink_domain, cfg.node_name) == ("GB200", 20.0, "clique-1", "b200-0")
    assert parse_engine_command(cmd, env, gpu="H100", speedup=2).gpu == "H100"
    plain = parse_engine_command(["vllm", "serve", "m"], {"XPYD_ZERO_DELAY": "1"})
    assert (plain.zero_delay, plain.side_channel_port, plain.side_channel_host) == (True, 5600, "127.0.0.1")


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "missing the vLLM command line"),
        (["vllm", "run", "m"], "vllm serve MODEL"),
        (["python3", "-m", "http.server"], "neither vLLM"),
        (["llama-server", "-m", "x"], "not a vLLM or SGLang command line"),
        (["vllm", "serve", "m", "--kv-transfer-config", "{nope"], "not JSON"),
        (["vllm", "serve", "m", "--port", "eighty"], "bad engine flag"),
    ],
)
def test_bad_command_lines(command: list[str], message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        parse_engine_command(command, {})


REAL_ENGINE_FLAGS = shlex.split(
    "--enable-chunked-prefill --trust-remote-code --disable-log-requests --enable-log-requests "
    "--max-num-partial-prefills 2 --long-prefill-token-threshold 8 --data-parallel-backend mp "
    "--enable-eplb --eplb-config {} --expert-placement-strategy linear --dbo-decode-token-threshold 32 "
    "--ec-transfer-config {} --decode-context-parallel-size 1 --max-seq-len-to-capture 8 "
    "--kv-cache-dtype fp8 --enforce-eager --max-logprobs 5 --dtype auto --quantization fp8 --seed 1 "
    "--swap-space 4 --cpu-offload-gb 0 --enable-lora --max-loras 2 --max-lora-rank 8 --tokenizer t "
    "--load-format auto --disable-log-stats --api-key k --chat-template t --tool-call-parser hermes "
    "--enable-auto-tool-choice --reasoning-parser r --speculative-config {} --compilation-config {} "
    "--async-scheduling --enable-dp-lm-head --distributed-executor-backend mp --enable-mixed-chunk "
    "--disaggregation-transfer-backend nixl --disaggregation-ib-device mlx5_0 --disable-cuda-graph "
    "--schedule-policy lpm --max-queued-requests 10 --attention-backend fa3 --enable-metrics "
    "--max-total-tokens 100 --cuda-graph-max-bs 8 --disaggregation-decode-tp 2 --disaggregation-decode-dp 1 "
    "--load-balance-method round_robin --moe-runner-backend auto --dist-timeout 60 --max-prefill-tokens 8 "
    "--ep-num-redundant-experts 32 --enable-eplb --deepep-config x --moe-dense-tp-size 1"
)


def test_real_engine_flags_the_emulator_does_not_model_pass_through() -> None:
    cfg = parse_engine_command(["vllm", "serve", "m", *REAL_ENGINE_FLAGS], {})
    assert cfg.extra_args == REAL_ENGINE_FLAGS


def test_config_file_env_fallbacks_and_connector_options(tmp_path: Path) -> None:
    path = tmp_path / "vllm.yaml"
    path.write_text("max_model_len: 4096\ntensor-parallel-size: 2\nenable-prefix-caching: false\n"
                    "served-model-name: [a, b]\nkv-transfer-config: {kv_connector: NixlConnector}\n")  # fmt: skip
    cfg = parse_engine_command(["vllm", "serve", "m", "--config", str(path), "-tp", "4"], {})
    assert (cfg.max_model_len, cfg.tp, cfg.served_model_names) == (4096, 4, ["a", "b"])  # the command line wins
    assert cfg.kv_transfer_config == {"kv_connector": "NixlConnector"}
    assert (
        parse_engine_command(["vllm", "serve", "m"], {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "45"}).kv_lease_seconds == 45
    )
    both = {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "45", "XPYD_KV_LEASE_SECONDS": "5"}
    assert parse_engine_command(["vllm", "serve", "m"], both).kv_lease_seconds == 5
    sglang = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--disaggregation-mode", "null"]
    assert parse_engine_command(sglang, {}).disaggregation_mode is None
    limits = parse_engine_command(["vllm", "serve", "m"], {"XPYD_MAX_BODY_MB": "0.5", "XPYD_DRAIN_TIMEOUT": "3"})
    assert (limits.max_body_bytes, limits.drain_seconds, limits.max_connections) == (1 << 19, 3.0, 4096)
