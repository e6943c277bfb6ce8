"""Every `xpyd` command turns bad input into one line naming the problem and the fix, exit code 2."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from xpyd_cli import errors
from xpyd_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "data" / "traces" / "conversation_trace.jsonl")
SPEC = str(ROOT / "bench" / "sim" / "llama70b-hgx.yaml")


def refused_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache and state: no binaries built, no cluster running, no kubeconfig."""
    monkeypatch.setenv("XPYD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XPYD_CLUSTER_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def bad_kubeconfig(tmp: Path, server: str) -> str:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


CASES: list[tuple[str, list[str], str]] = [
    ("unknown command", ["frobnicate"], "unknown command"),
    ("load: missing trace", ["load", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", "nosuch.jsonl"],
     "nosuch.jsonl does not exist"),
    ("load: trace of unknown format", ["load", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", "README.md"],
     "unknown trace format"),
    ("load: not a URL", ["load", "--url", "notaurl", "--model", "m"], "--url must be an http(s) base URL"),
    ("load: unreachable URL", ["load", "--url", "{refused}", "--model", "m", "--rate", "50", "--duration", "2"],
     "is the router running?"),
    ("load: bad number", ["load", "--url", "http://127.0.0.1:9", "--model", "m", "--rate", "fast"],
     "invalid float value"),
    ("load: missing flag", ["load", "--model", "m"], "the following arguments are required: --url"),
    ("simulate: missing spec", ["simulate", "--spec", "nosuch.yaml", "--trace", TRACE], "nosuch.yaml does not exist"),
    ("simulate: spec not YAML", ["simulate", "--spec", "README.md", "--trace", TRACE], "not valid YAML"),
    ("simulate: spec of another kind", ["simulate", "--spec", "{tmp}/cm.yaml", "--trace", TRACE],
     "no DisaggregatedDeployment object in the file"),
    ("simulate: missing trace", ["simulate", "--spec", SPEC, "--trace", "nosuch.csv"], "nosuch.csv does not exist"),
    ("simulate: malformed trace", ["simulate", "--spec", SPEC, "--trace", "{tmp}/bad.jsonl"], "bad.jsonl"),
    ("plan: unknown model", ["plan", "--model", "nosuch", "--topology", "HGX-B200"], "unknown model 'nosuch'"),
    ("plan: unknown topology", ["plan", "--model", "llama-3.1-70b", "--topology", "nosuch"], "unknown topology"),
    ("operator: no credentials", ["operator"], "no Kubernetes credentials"),
    ("operator: unreachable API server", ["operator", "--startup-timeout", "0.5"], "cannot reach the API server"),
    ("operator: kubeconfig not YAML", ["operator"], "kubeconfig cannot be read"),
    ("operator: bad flag", ["operator", "--kubeconfig", "x"], "unrecognized arguments: --kubeconfig"),
    ("cluster: unknown action", ["cluster", "frob"], "invalid choice: 'frob'"),
    ("cluster: binaries missing", ["cluster", "nodes"], "run 'make cluster-up'"),
    ("cluster: not running", ["cluster", "env"], "not running; start it with 'make cluster-up'"),
    ("render: missing file", ["render", "nosuch.yaml"], "nosuch.yaml does not exist"),
    ("render: not YAML", ["render", "{tmp}/garbage.yaml"], "not valid YAML at line 2"),
    ("render: no deployment", ["render", "{tmp}/cm.yaml"], "no DisaggregatedDeployment in the file"),
    ("render: schema", ["render", "{tmp}/dd.yaml", "--topology", "HGX-B200"], "multiple of 8 on HGX-B200"),
    ("render: does not fit", ["render", "{tmp}/dd.yaml"], "(Ready=False, ReplicaDoesNotFit): prefill: deepseek-v3"),
    ("render: bad topology", ["render", "{tmp}/dd.yaml", "--topology", "TPU"], "--topology must be one of"),
    ("render: bad network", ["render", "{tmp}/dd.yaml", "--default-network", "Slingshot"], "--default-network"),
]  # fmt: skip
# Does not fit a GB200 tray (671 GB of FP8 weights), and breaks HGX-B200's 8-GPU node limit.
DEEPSEEK_ON_A_TRAY = """
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {name: ds}
spec:
  model: {name: deepseek-ai/DeepSeek-V3}
  topology: {kind: GB200-NVL72}
  prefill: {replicas: 1, gpusPerReplica: 4}
  decode: {replicas: 1, gpusPerReplica: 12}
"""


@pytest.mark.parametrize(("name", "argv", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_line_and_exit_2(
    name: str,
    argv: list[str],
    expected: str,
    no_cluster: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tmp = no_cluster
    (tmp / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    (tmp / "bad.jsonl").write_text('{"timestamp": 0, "input_length": "many"}\n')
    (tmp / "garbage.yaml").write_text("a: [\n")
    (tmp / "dd.yaml").write_text(DEEPSEEK_ON_A_TRAY)
    if name == "operator: unreachable API server":
        monkeypatch.setenv("KUBECONFIG", bad_kubeconfig(tmp, refused_url().replace("http", "https")))
    if name == "operator: kubeconfig not YAML":
        (tmp / "garbage").write_text("clusters: [\n")
        monkeypatch.setenv("KUBECONFIG", str(tmp / "garbage"))
    args = [a.replace("{tmp}", str(tmp)).replace("{refused}", refused_url()) for a in argv]
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse exits by itself
        rc = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() + captured.out.splitlines() if line.strip()]
    assert rc == 2, captured
    assert "Traceback" not in captured.err
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert lines[0].startswith("xpyd")


def test_the_installed_command_prints_one_line_too(no_cluster: Path) -> None:
    """Through the console script (a real process): the same one line, no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "xpyd_cli.main", "load", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", "x"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["xpyd load: trace file x does not exist"]


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (FileNotFoundError(errno.ENOENT, "No such file", "spec.yaml"), "spec.yaml does not exist; check the path"),
        (PermissionError(errno.EACCES, "denied", "/etc/shadow"), "permission denied on /etc/shadow"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "cannot connect (Connection refused)"),
        (subprocess.CalledProcessError(3, ["bash", "x.sh"]), "'bash x.sh' failed with exit code 3"),
        (json.JSONDecodeError("Expecting value", "{", 1), "not valid JSON at line 1, column 2"),
        (ValueError("bad\nthing"), "bad thing"),
        (ZeroDivisionError("oops"), "a bug: rerun with XPYD_DEBUG=1"),
    ],
)
def test_describe_names_problem_and_fix(exc: BaseException, expected: str) -> None:
    line = errors.describe(exc)
    assert expected in line
    assert "\n" not in line


def test_yaml_errors_say_where() -> None:
    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load("a: [\n")
    assert errors.describe(info.value).startswith("not valid YAML at line 2")


def test_an_unexpected_failure_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import xpyd_perf.cli

    def boom(argv: list[str], **_: object) -> int:  # `xpyd` passes plan its URL reader (fetch=)
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(xpyd_perf.cli, "main", boom)
    assert main(["plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "xpyd plan: unexpected ZeroDivisionError: division by zero (a bug: rerun with XPYD_DEBUG=1 for the traceback"
        " and report it)"
    ]
    monkeypatch.setenv("XPYD_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["plan"])
