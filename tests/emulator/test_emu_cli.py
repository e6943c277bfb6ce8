"""`xpyd emulate` bad input: one stderr line naming the problem and the fix, exit code 2, no traceback."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest
from emu_harness import free_port  # type: ignore[import-not-found]

from xpyd_emulator.cli import main

XPYD = str(Path(sys.executable).with_name("xpyd"))
VLLM = ["--", "vllm", "serve", "m"]
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--speedup", "fast", *VLLM], {}, "argument --speedup: invalid float value"),
        (["--speedup", "-2", *VLLM], {}, "--speedup must be > 0"),
        (["--log-level", "LOUD", *VLLM], {}, "argument --log-level: invalid choice"),
        (["--gpu", "TPU", *VLLM], {}, "set --gpu or XPYD_GPU"),
        (["--drain-timeout", "-1", *VLLM], {}, "--drain-timeout: -1 is out of range"),
        (["--max-connections", "lots", *VLLM], {}, "--max-connections: 'lots' is not an integer"),
        (["--kv-peers", "10.0.0.0/33", *VLLM], {}, "--kv-peers: '10.0.0.0/33' is neither"),
        (["--bogus", *VLLM], {}, "unrecognized arguments: --bogus"),
        (VLLM, {"XPYD_SPEEDUP": "x"}, "env XPYD_SPEEDUP: 'x' is not a number"),
        (VLLM, {"XPYD_KV_LEASE_SECONDS": "0"}, "env XPYD_KV_LEASE_SECONDS: 0 is out of range"),
        (VLLM, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "99999"}, "env VLLM_NIXL_SIDE_CHANNEL_PORT: 99999 is out of range"),
        (VLLM, {"XPYD_MAX_BODY_MB": "0"}, "XPYD_MAX_BODY_MB: 0 is out of range"),
        (VLLM, {"XPYD_ZERO_DELAY": "maybe"}, "env XPYD_ZERO_DELAY: 'maybe' is not a boolean"),
        ([*VLLM, "--port", "70000"], {}, "argument --port: 70000 is out of range [1, 65535]"),
        ([*VLLM, "--port", "http"], {}, "argument --port: 'http' is not an integer"),
        ([*VLLM, "--port"], {}, "argument --port: expected one argument"),
        ([*VLLM, "-tp", "0"], {}, "0 is out of range"),
        ([*VLLM, "--gpu-memory-utilization", "1.5"], {}, "1.5 is out of range (0, 1]"),
        ([*VLLM, "--kv-transfer-config", "{kv_connector:Nixl}"], {}, "--kv-transfer-config is not JSON"),
        ([*VLLM, "--kv-transfer-config", "[1]"], {}, "must be a JSON object"),
        ([*VLLM, "--kv-transfer-config", '{"kv_role":"kv_both"}'], {}, 'needs a "kv_connector" string'),
        ([*VLLM, "--kv-transfer-config", '{"kv_connector":"N","kv_role":"kv_all"}'], {}, "kv_role 'kv_all'"),
        ([*VLLM, "--max-model-length", "4096"], {}, "did you mean --max-model-len?"),
        ([*VLLM, "--tensor-parallel", "2"], {}, "did you mean --tensor-parallel-size?"),
        ([*VLLM, "--kv-transfer-confg", KV], {}, "did you mean --kv-transfer-config?"),
        ([*VLLM, "--config", "/nonexistent/vllm.yaml"], {}, "--config /nonexistent/vllm.yaml: cannot read it"),
        (["--", "python3", "-m", "sglang.launch_server", "--model-path", "m", "--disaggregation-mode", "both"], {},
         "argument --disaggregation-mode: invalid choice"),
        (["--join-timeout", "0", *VLLM], {}, "--join-timeout: 0 is out of range (0, 86400]"),
        (VLLM, {"XPYD_HEARTBEAT_TIMEOUT": "0.1"}, "XPYD_HEARTBEAT_TIMEOUT: 0.1 is out of range [0.2, 600]"),
        ([*VLLM, "-dp", "16", "-dpl", "8", "--headless"], {}, "runs the API server: drop --headless"),
        (["--", "sh", "-c", "exec vllm serve m --data-parallel-start-rank $(( 8 / 0 ))"], {}, "division by zero"),
        (["--", "llama-server", "-m", "x"], {}, "not a vLLM or SGLang command line"),
        ([], {}, "missing the vLLM command line"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], expected: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for name in [n for n in os.environ if n.startswith(("XPYD_", "VLLM_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("xpyd emulate: error: ")
    assert expected in err, err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("port: [unclosed", "is not valid YAML"),
        ("- a\n- b\n", "must be a YAML mapping"),
        (None, "cannot read it"),  # a folder
        ("max-model-length: 10\n", "did you mean --max-model-len?"),
        ("port: 70000\n", "70000 is out of range"),
    ],
)
def test_bad_config_files(
    content: str | None, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "vllm.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert main([*VLLM, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert (err.count("\n"), expected in err) == (1, True), err


async def test_a_port_in_use_is_one_line_and_exit_2() -> None:
    host = "127.0.0.61"
    with socket.socket() as taken:
        taken.bind((host, free_port(host)))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            XPYD, "emulate", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(port),
            env=dict(os.environ, XPYD_BIND_HOST=host), stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2
    assert len(lines) == 1, lines
    assert "address already in use; free the port or pick another" in lines[0]
