"""The router on a cluster: discovers a deployment's worker pods, serves prefill then decode, drops deleted pods."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xpyd_api import labels
from xpyd_perf import TOPOLOGIES

from .kube import apply, is_local_cluster, kubectl, ready_pod, wait_until

pytestmark = pytest.mark.e2e
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEPLOYMENT = "chat"
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
PROMPT = "You are a helpful assistant. Answer briefly. " * 60


def worker_pod(name: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {labels.DEPLOYMENT: DEPLOYMENT, labels.ROLE: role}},
        "spec": {
            "nodeSelector": TOPOLOGIES["HGX-B200"].node_selector(),
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": [MODEL, "--port", "8000", "--kv-transfer-config", KV],
                    "env": [{"name": "XPYD_SPEEDUP", "value": "50"}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "resources": {"limits": {labels.GPU_RESOURCE: "1"}},
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def ready_counts(router: str) -> dict[str, int]:
    _, body = get(router + "/health")
    return dict(json.loads(body).get("ready", {}))  # a 503 body has no "ready": {}


def metric(router: str, name: str, **want: str) -> float:
    _, body = get(router + "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in want.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def router(namespace: str, tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    xpyd = str(Path(sys.executable).with_name("xpyd"))
    cmd = [xpyd, "router", "--deployment", DEPLOYMENT, "--namespace", namespace, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--direct-below-chars", "0", "--scrape-interval", "0.5"]
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_router_discovers_serves_two_hops_and_drops_a_deleted_pod(namespace: str, router: str) -> None:
    if not is_local_cluster():
        pytest.skip("needs the local cluster, whose pod IPs (loopback) this test process can reach")
    apply([worker_pod("prefill-0", "prefill"), worker_pod("decode-0", "decode"), worker_pod("decode-1", "decode")],
          namespace)  # fmt: skip
    for name in ("prefill-0", "decode-0", "decode-1"):
        wait_until(f"pod {name} Ready", lambda n=name: ready_pod(namespace, n), timeout=120)  # type: ignore[misc]
    wait_until("the router to see 1 prefill and 2 decode workers",
               lambda: ready_counts(router) == {"prefill": 1, "decode": 2, "worker": 0}, timeout=60)  # fmt: skip

    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "stream": True}
    status, raw = post(router + "/v1/completions", body)
    assert status == 200, raw
    events = [line for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    assert len(events) >= 7  # 6 tokens, then [DONE]
    assert metric(router, "xpyd_router_hop_latency_seconds_count", hop="prefill") == 1
    assert metric(router, "xpyd_router_hop_latency_seconds_count", hop="decode") == 1

    kubectl("delete", "pod", "decode-0", "-n", namespace, "--wait=false")
    wait_until("the router to drop the deleted decode pod",
               lambda: ready_counts(router).get("decode") == 1, timeout=30)  # fmt: skip
    for i in range(6):
        status, raw = post(router + "/v1/completions", {**body, "prompt": f"{i} {PROMPT}", "stream": False})
        assert status == 200, raw
    assert metric(router, "xpyd_router_errors_total", kind="worker_failed") == 0  # never sent to the gone pod
    assert metric(router, "xpyd_router_hop_latency_seconds_count", hop="decode") == 7
