"""The process kubelet's hosts file (its stand-in for DNS) and the engine shims a pod's shell finds on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from xpyd_cluster import hosts, shims


def lws_pod(name: str, namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_pod_with_hostname_and_subdomain_gets_three_names() -> None:
    entry = hosts.entry_of(lws_pod("g-0", hostname="g-0", subdomain="g"), "127.1.0.4")
    assert entry is not None
    assert entry.names() == ["g-0.g.ns", "g-0.g.ns.svc", "g-0.g.ns.svc.cluster.local"]


def test_pods_without_subdomain_or_off_loopback_get_no_entry() -> None:
    assert hosts.entry_of(lws_pod("p", hostname="p"), "127.1.0.4") is None
    assert hosts.entry_of(lws_pod("p", subdomain="s"), "127.1.0.4") is None
    assert hosts.entry_of(lws_pod("p", hostname="p", subdomain="s"), "10.0.0.1") is None


def test_render_is_etc_hosts_format_sorted_and_the_last_claim_wins() -> None:
    old = hosts.HostEntry("127.1.0.1", "g-0", "g", "ns")
    other = hosts.HostEntry("127.1.0.2", "g-0-1", "g", "ns")
    successor = hosts.HostEntry("127.1.0.9", "g-0", "g", "ns")
    lines = hosts.render([old, other, successor]).splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == [
        "127.1.0.2\tg-0-1.g.ns",
        "127.1.0.2\tg-0-1.g.ns.svc",
        "127.1.0.2\tg-0-1.g.ns.svc.cluster.local",
        "127.1.0.9\tg-0.g.ns",
        "127.1.0.9\tg-0.g.ns.svc",
        "127.1.0.9\tg-0.g.ns.svc.cluster.local",
    ]
    assert hosts.render([]) == hosts.HEADER


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state" / "hosts"
    hosts.write(path, [hosts.HostEntry("127.1.0.1", "a", "b", "c")])
    hosts.write(path, [])
    assert path.read_text() == hosts.HEADER
    assert [p.name for p in path.parent.iterdir()] == ["hosts"]


def _fake_xpyd(tmp_path: Path) -> str:
    fake = tmp_path / "xpyd"
    fake.write_text('#!/bin/sh\necho "xpyd $*"\n')
    fake.chmod(0o755)
    return str(fake)


def _sh(shim_dir: Path, script: str, **env: str) -> str:
    path = f"{shim_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    result = subprocess.run(
        ["/bin/sh", "-c", script], env={"PATH": path, **env}, capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def test_shims_send_engine_commands_to_the_emulator(tmp_path: Path) -> None:
    directory = shims.install(tmp_path / "shims", _fake_xpyd(tmp_path), sys.executable)
    script = "exec vllm serve m --data-parallel-start-rank $(( ${LWS_WORKER_INDEX:-0} * 8 ))"
    assert _sh(directory, script, LWS_WORKER_INDEX="1") == "xpyd emulate -- vllm serve m --data-parallel-start-rank 8"
    assert _sh(directory, script) == "xpyd emulate -- vllm serve m --data-parallel-start-rank 0"
    sglang = _sh(directory, "python3 -m sglang.launch_server --model-path m --node-rank 1")
    assert sglang == "xpyd emulate -- python3 -m sglang.launch_server --model-path m --node-rank 1"
    api = _sh(directory, "python -m vllm.entrypoints.openai.api_server --model m")
    assert api == "xpyd emulate -- python3 -m vllm.entrypoints.openai.api_server --model m"


def test_python_shim_runs_the_real_interpreter_for_anything_else(tmp_path: Path) -> None:
    directory = shims.install(tmp_path / "shims", _fake_xpyd(tmp_path), sys.executable)
    assert _sh(directory, "python3 -c 'import sys; print(sys.executable)'") == sys.executable
    assert _sh(directory, "python -m json.tool --help >/dev/null && echo ok") == "ok"
    assert all(os.access(directory / name, os.X_OK) for name in ("vllm", "python3", "python"))


def test_shim_scripts_quote_paths() -> None:
    scripts = shims.scripts("/a dir/xpyd", "/py dir/python3")
    assert "exec '/a dir/xpyd' emulate -- vllm \"$@\"" in scripts["vllm"]
    assert "exec '/py dir/python3' \"$@\"" in scripts["python3"]
    assert scripts["python"] == scripts["python3"]
