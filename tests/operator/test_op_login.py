"""In-cluster login follows KUBERNETES_SERVICE_HOST/PORT and the projected token, as client-go does."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpyd_operator.handlers import in_cluster_login


def write_token_dir(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "ca.crt").write_text("CA")
    (tmp_path / "namespace").write_text("xpyd-system")
    return tmp_path


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("127.0.0.1", "6443", "https://127.0.0.1:6443"),
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("fd00::1", "443", "https://[fd00::1]:443"),
    ],
)
def test_server_comes_from_the_service_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str, port: str, server: str
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    info = in_cluster_login(write_token_dir(tmp_path))
    assert info is not None
    assert info.server == server
    assert info.token == "tok"
    assert info.default_namespace == "xpyd-system"
    assert info.ca_path == str(tmp_path / "ca.crt")


def test_outside_a_cluster_there_is_no_in_cluster_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert in_cluster_login(write_token_dir(tmp_path)) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    assert in_cluster_login(tmp_path / "missing") is None
