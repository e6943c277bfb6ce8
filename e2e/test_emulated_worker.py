"""A vLLM pod on the local cluster runs the emulator and answers at its pod IP like vLLM would."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from .kube import apply, is_local_cluster, ready_pod, wait_until

pytestmark = pytest.mark.e2e
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vllm", "labels": {"app": "vllm"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": [MODEL, "--port", "8000", "--tensor-parallel-size", "2"],
                    "env": [{"name": "XPYD_SPEEDUP", "value": "20"}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }


def test_vllm_pod_answers_a_completion_at_its_pod_ip(namespace: str) -> None:
    if not is_local_cluster():
        pytest.skip("needs the local cluster's process kubelet to run vLLM images as the emulator")
    apply([vllm_pod()], namespace)
    pod = wait_until("the vLLM pod to be Ready", lambda: ready_pod(namespace, "vllm"), timeout=90)
    ip = pod["status"]["podIP"]
    body = json.dumps({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{ip}:8000/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer = json.load(resp)
    assert answer["model"] == MODEL
    assert answer["usage"]["completion_tokens"] == 4
    assert answer["choices"][0]["finish_reason"] == "length"
    with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert "vllm:cache_config_info{" in metrics
    assert "vllm:num_requests_waiting" in metrics
