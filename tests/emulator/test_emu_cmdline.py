"""Reading vLLM and SGLang command lines and the pod env into the emulator configuration."""

from __future__ import annotations

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
