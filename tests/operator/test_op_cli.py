"""The `xpyd operator` command line and the wiring of the autoscaler loops beside the reconcile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from xpyd_operator import cli
from xpyd_operator.autoscaling.loop import Autoscalers


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--namespace", "a", "--all-namespaces"], "either --namespace or --all-namespaces"),
        (["--resync-seconds", "0"], "--resync-seconds must be > 0"),
        (["--default-network", "Slingshot"], "--default-network: 1 validation error"),
        (["--default-network", '{"profile": "None", "env": {"A": "1"}}'], "takes no additions; use Custom"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "argv", "want"),
    [("", [], ""), ("InfiniBand", [], "InfiniBand"), ("InfiniBand", ["--default-network", "RoCE"], "RoCE")],
)
def test_default_network_flag_and_env(monkeypatch: pytest.MonkeyPatch, env: str, argv: list[str], want: str) -> None:
    monkeypatch.setenv("XPYD_DEFAULT_NETWORK", env)
    assert cli._parser().parse_args(argv).default_network == want


def _dd(name: str, autoscaling: dict[str, Any], model: str = "meta-llama/Llama-3.1-8B-Instruct") -> dict[str, Any]:
    pool = {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}
    spec = {"model": {"name": model}, "prefill": pool, "decode": pool, "autoscaling": autoscaling}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


class _Parked(Autoscalers):
    """Loops that wait instead of talking to an API server."""

    async def _loop(self, ns: str, name: str) -> None:
        await asyncio.Event().wait()


async def test_loops_start_once_for_valid_specs_with_autoscaling_on() -> None:
    scalers = _Parked(client=None, enqueue=lambda ns, name: None)  # type: ignore[arg-type]
    objects = [
        _dd("on", {"enabled": True}),
        _dd("off", {"enabled": False}),
        _dd("invalid", {"enabled": True, "intervalSeconds": 0}),  # the reconciler reports it; no loop
    ]
    scalers.ensure(objects)
    first = dict(scalers.tasks)
    scalers.ensure(objects)
    assert list(first) == ["ns/on"]
    assert scalers.tasks == first  # a running loop is not started twice
    await scalers.close()
    assert scalers.tasks == {}


@pytest.mark.parametrize(
    ("env", "argv", "on", "endpoint"),
    [
        ({}, [], False, "https://huggingface.co"),
        ({"XPYD_MODEL_HUB": "true", "HF_ENDPOINT": "https://mirror.example/"}, [], True, "https://mirror.example"),
        ({}, ["--model-hub", "--model-hub-endpoint", "http://127.0.0.1:9"], True, "http://127.0.0.1:9"),
    ],
)
def test_model_hub_flags_and_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], on: bool, endpoint: str
) -> None:
    for name in ("XPYD_MODEL_HUB", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = cli._parser().parse_args(argv)
    assert (args.model_hub, args.model_hub_endpoint) == (on, endpoint)


def test_a_bad_model_hub_endpoint_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--model-hub", "--model-hub-endpoint", "ftp://mirror"]) == 2
    assert "--model-hub-endpoint must be an http(s) URL" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, (False, "15s", "")),
        (
            {"XPYD_ROUTER_POD_MONITOR": "true", "XPYD_POD_MONITOR_INTERVAL": "30s", "XPYD_POD_MONITOR_LABELS": "{}"},
            (True, "30s", "{}"),
        ),
    ],
)
def test_router_pod_monitor_flags_and_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: tuple[bool, str, str]
) -> None:
    for name in ("XPYD_ROUTER_POD_MONITOR", "XPYD_POD_MONITOR_INTERVAL", "XPYD_POD_MONITOR_LABELS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = cli._parser().parse_args([])
    assert (args.router_pod_monitor, args.pod_monitor_interval, args.pod_monitor_labels) == want


@pytest.mark.parametrize(
    ("labels", "message"), [("{nope", "not JSON"), ('{"a": 1}', "a JSON object of string labels"), ("[]", "object")]
)
def test_bad_pod_monitor_labels_exit_2(labels: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--router-pod-monitor", "--pod-monitor-labels", labels]) == 2
    out = capsys.readouterr().out
    assert "--pod-monitor-labels: " in out and message in out


def test_pod_monitor_labels_parse() -> None:
    assert cli._labels('{"release": "kps"}') == {"release": "kps"}
    assert cli._labels("") == {}
