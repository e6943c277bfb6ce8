"""Command-line validation of `xpyd router`: one line naming the problem and its fix, exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from chat_models import model_dir  # type: ignore[import-not-found]  # tests/router is on sys.path

from xpyd_router.cli import main, parser, static_workers

U = "http://127.0.0.1:9"
XPYD = str(Path(sys.executable).with_name("xpyd"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give either --deployment"),
        (["--deployment", "d", "--decode", U], "give either --deployment"),
        (["--worker", U, "--decode", U], "cannot be mixed"),
        (["--prefill", U], "needs at least one --decode"),
        (["--decode", U, "--port", "0"], "--port must be"),
        (["--decode", U, "--block-chars", "100"], "multiple of 8"),
        (["--decode", U, "--max-attempts", "0"], "--max-attempts"),
        (["--decode", "localhost:1"], "worker URL must look like"),
        (["--decode", "http://host"], "worker URL must look like"),
        (["--decode", "https://host:8000"], "plain HTTP"),
        (["--decode", "http://host:99999"], "worker URL must look like"),
        (["--decode", "http://host:80/v1"], "worker URL must look like"),
        (["--decode", U, "--policy", "magic"], "invalid choice: 'magic'"),
        (["--decode", U, "--port", "abc"], "invalid int value: 'abc'"),
        (["--decode", U, "--bogus"], "unrecognized arguments: --bogus"),
        (["--decode", U, "--request-timeout", "0"], "--request-timeout must be a positive number"),
        (["--decode", U, "--first-byte-timeout", "nan"], "--first-byte-timeout must be a positive number"),
        (["--decode", U, "--header-timeout", "-1"], "--header-timeout must be a positive number"),
        (["--decode", U, "--upstream-timeout", "inf"], "--first-byte-timeout must be a positive number"),
        (["--decode", U, "--max-connections", "0"], "--max-connections must be at least 1"),
        (["--decode", U, "--log-level", "chatty"], "--log-level must be"),
        (["--decode", U, "--api-key-file", "/nonexistent/key"], "cannot read --api-key-file /nonexistent/key"),
        (["--decode", U, "--kv-events-port", "5557"], "--kv-events-port needs --tokenizer"),
        (["--decode", U, "--tokenizer", "emulator", "--kv-events-port", "70000"], "--kv-events-port must be 0-65535"),
        (["--decode", U, "--block-size", "0"], "--block-size must be 1-1024 tokens"),
        (["--decode", U, "--tokenizer-threads", "-1"], "--tokenizer-threads must be 0-64, got -1"),
        (["--decode", U, "--data-parallel-size", "0"], "--data-parallel-size must be 1-100, got 0"),
        (["--decode", U, "--data-parallel-size", "101"], "--data-parallel-size must be 1-100, got 101"),
        (["--decode", "http://127.0.0.1:9#dp1"], "worker URL must look like"),
        (["--decode", U, "--peers", U, "--peer-sync", "0"], "--peer-sync must be a positive number"),
        (["--decode", U, "--direct-below-chars", "-1"], "--direct-below-chars must be 0 or more characters, got -1"),
        (["--decode", U, "--direct-lead-chars", "-5"], "--direct-lead-chars must be 0 or more characters, got -5"),
        (["--decode", U, "--direct-max-chars", "-2"], "--direct-max-chars must be 0 or more characters, got -2"),
        (["--decode", U, "--tokenizer", "/nonexistent/tokenizer.json"], "--tokenizer /nonexistent/tokenizer.json"),
        (["--decode", U, "--tokenizer", "hf:"], "--tokenizer hf:: want hf:ORG/NAME[@REVISION]"),
        (["--decode", U, "--tokenizer", "hf:a/b/c"], "--tokenizer hf:a/b/c: want hf:ORG/NAME[@REVISION]"),
        (["--decode", U, "--tokenizer", "hf:org/m@x y"], "the revision after '@' must be"),
        (["--decode", U, "--chat-template", "t.jinja"], "--chat-template needs --tokenizer PATH or hf:REPO"),
        (["--decode", U, "--cpu-tier-gpu", "B200"], "--cpu-tier-gpu and --cpu-tier-model go together"),
        (["--decode", U, "--cpu-tier-model", "llama-3.1-8b"], "--cpu-tier-gpu and --cpu-tier-model go together"),
        (["--decode", U, "--cpu-tier-gpu", "Z9", "--cpu-tier-model", "llama-3.1-8b"], "--cpu-tier-*: "),
        (["--decode", U, "--cpu-tier-gpu", "B200", "--cpu-tier-model", "no-such-model"], "--cpu-tier-*: "),
        (
            ["--decode", U, "--cpu-tier-gpu", "B200", "--cpu-tier-model", "llama-3.1-8b", "--cpu-tier-tp", "0"],
            "--cpu-tier-*: reload pricing needs tp >= 1",
        ),
        (["--decode", U, "--cpu-tier-weight", "0"], "--cpu-tier-weight must be more than 0 and at most 1, got 0.0"),
        (["--decode", U, "--cpu-tier-weight", "1.5"], "--cpu-tier-weight must be more than 0 and at most 1, got 1.5"),
        (["--decode", U, "--cpu-tier-weight", "nan"], "--cpu-tier-weight must be more than 0 and at most 1"),
        (["--decode", U, "--tokenizer", "emulator", "--chat-template", "t.jinja"], "--chat-template needs"),
        (
            ["--decode", U, "--tokenizer", "hf:org/m", "--chat-template", "/nonexistent/t.jinja"],
            "cannot read --chat-template /nonexistent/t.jinja: No such file or directory",
        ),
    ],
)
def test_bad_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert err.startswith("xpyd router: ")


def test_empty_api_key_env_is_refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XPYD_ROUTER_API_KEY", "  ")
    assert main(["--decode", U]) == 2
    assert "XPYD_ROUTER_API_KEY is empty" in capsys.readouterr().err


def test_safe_defaults() -> None:
    args = parser().parse_args(["--decode", U])
    assert args.host == "127.0.0.1"
    assert (args.connect_timeout, args.first_byte_timeout, args.idle_timeout) == (5.0, 120.0, 30.0)
    assert (args.request_timeout, args.header_timeout, args.body_timeout) == (600.0, 15.0, 30.0)
    assert args.max_connections == 4096
    assert args.api_key_file is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--decode", U, "--port", "x"], "invalid int value"),
        (["--decode", U, "--host", "256.0.0.1", "--port", "1"], "cannot listen on 256.0.0.1:1"),
    ],
)
def test_the_installed_command_prints_one_line(argv: list[str], message: str) -> None:
    done = subprocess.run([XPYD, "router", *argv], capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("flags", "events", "replay"),
    [
        ([], "", ""),
        (["--kv-events-port", "5557"], "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5657"),
        (["--kv-events-port", "7000", "--kv-replay-port", "7001"], "tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"),
        (["--kv-events-port", "5557", "--kv-replay-port", "0"], "tcp://127.0.0.1:5557", ""),
    ],
)
def test_static_workers_subscribe_to_kv_events_on_their_own_host(flags: list[str], events: str, replay: str) -> None:
    args = parser().parse_args(["--worker", U, "--tokenizer", "emulator", *flags])
    [spec] = static_workers(args)
    assert (spec.kv_events, spec.kv_replay) == (events, replay)


def test_static_data_parallel_workers_are_one_target_per_rank() -> None:
    flags = ["--tokenizer", "emulator", "--kv-events-port", "5557", "--data-parallel-size", "2"]
    args = parser().parse_args(["--prefill", U, "--decode", U, *flags])
    specs = static_workers(args)
    assert [(s.url, s.role, s.kv_events, s.kv_replay) for s in specs] == [
        (f"{U}#dp0", "prefill", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5657"),
        (f"{U}#dp1", "prefill", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5658"),
        (f"{U}#dp0", "decode", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5657"),
        (f"{U}#dp1", "decode", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5658"),
    ]


@pytest.mark.parametrize(
    ("setup", "flags", "message"),
    [
        ("empty-dir", [], "no tokenizer.json in"),
        ("model", ["--chat-template", "{template}"], "the chat template does not compile"),
        ("bad-config", [], "tokenizer_config.json is not a JSON object"),
    ],
)
def test_bad_local_tokenizers(
    tmp_path: Path, setup: str, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    if setup != "empty-dir":
        model_dir(model, "qwen2.5-instruct")
    else:
        model.mkdir()
    if setup == "bad-config":
        (model / "tokenizer_config.json").write_text("[]")
    template = tmp_path / "t.jinja"
    template.write_text("{% for %}")
    argv = ["--decode", U, "--tokenizer", str(model), *(f.format(template=template) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("xpyd router: ")


@pytest.mark.timeout(60)
def test_an_unreachable_hub_is_one_warning_line_then_routing_goes_on(tmp_path: Path) -> None:
    """The fetch fails (nothing listens at HF_ENDPOINT): one warning, and the router carries on to listen."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path))
    argv = [XPYD, "router", "--decode", U, "--tokenizer", "hf:org/m", "--host", "256.0.0.1", "--port", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=50, check=False, env=env)
    warning, refused = done.stderr.splitlines()
    assert "WARNING xpyd_router --tokenizer hf:org/m: cannot fetch tokenizer.json (cannot reach 127.0.0.1:" in warning
    assert warning.endswith("routing without a tokenizer (byte-block prefix keys, engine KV events unused)")
    assert refused.startswith("xpyd router: cannot listen on 256.0.0.1:1") and done.returncode == 2
