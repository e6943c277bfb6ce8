"""Mutated requests against a running `xpyd emulate`: no 5xx from client input, no hang, no crash, gauges to 0."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from emu_harness import KV_CONFIG, free_port  # type: ignore[import-not-found]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

XPYD = str(Path(sys.executable).with_name("xpyd"))
HOST = "127.0.0.71"
PEER = "127.0.0.72"  # the only allowed KV peer; nothing listens there
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
PULL = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e", "remote_block_ids": [0, 1],
        "remote_host": PEER, "remote_port": 5600, "tp_size": 1}  # fmt: skip
SEEDS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": MODEL, "prompt": "hello world " * 10, "max_tokens": 8}),
    ("/v1/completions", {"prompt": [1, 2, 3] * 20, "max_tokens": 4, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                              "stream": True, "max_completion_tokens": 3}),
    ("/v1/completions", {"prompt": "prefill me " * 30, "max_tokens": 1, "kv_transfer_params": HOP}),
    ("/v1/completions", {"prompt": "decode me " * 30, "max_tokens": 3, "kv_transfer_params": PULL}),
]  # fmt: skip
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
          "temperature", "top_p", "n", "kv_transfer_params", "bootstrap_host", "bootstrap_room"]  # fmt: skip
KV_FIELDS = [*PULL, "xpyd_nvlink_domain", "xpyd_node_name"]
SPICY = [0, -1, 1, 2**31, 2**63, 65536, "", "127.0.0.1", PEER, "169.254.169.254", "evil.example", "[::1]",
         [], [0], [True], list(range(300)), {}, None, True, 1e308, "a" * 5000]  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30)
    | st.sampled_from(SPICY),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
mutations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(FIELDS), json_values),
        st.tuples(st.just("drop"), st.sampled_from(FIELDS), st.none()),
        st.tuples(st.just("kv"), st.sampled_from(KV_FIELDS), json_values),
    ),
    max_size=4,
)


def mutate(body: dict[str, Any], changes: list[tuple[str, str, Any]]) -> dict[str, Any]:
    out = dict(body)
    for op, field, value in changes:
        if op == "set":
            out[field] = value
        elif op == "drop":
            out.pop(field, None)
        else:
            kv = out.get("kv_transfer_params")
            out["kv_transfer_params"] = dict(kv if isinstance(kv, dict) else PULL, **{field: value})
    return out


def call(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=10)  # a request slower than this is a hang
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port(HOST)
    log = tmp_path_factory.mktemp("fuzz") / "emulator.log"
    env = dict(os.environ, XPYD_BIND_HOST=HOST, XPYD_SPEEDUP="2000", XPYD_KV_PEERS=PEER, XPYD_KV_LEASE_SECONDS="0.5",
               VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port(HOST)))  # fmt: skip
    kv = KV_CONFIG.replace("}", ',"kv_load_failure_policy":"recompute"}')
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [XPYD, "emulate", "--log-level", "INFO", "--", "vllm", "serve", MODEL, "--port", str(port),
             "--max-model-len", "2048", "--num-gpu-blocks-override", "512", "--kv-transfer-config", kv],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    for _ in range(500):
        try:
            if call(port, "GET", "/health")[0] == 200:
                break
        except OSError:
            time.sleep(0.02)
    yield proc, port, log
    proc.terminate()
    proc.wait(10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])  # fmt: skip
@given(seed=st.sampled_from(SEEDS), changes=mutations, cut=st.none() | st.integers(0, 400),
       noise=st.none() | st.binary(max_size=40))  # fmt: skip
def test_mutated_requests(
    emulator: tuple[subprocess.Popen[bytes], int, Path],
    seed: tuple[str, dict[str, Any]], changes: list[tuple[str, str, Any]], cut: int | None, noise: bytes | None,
) -> None:  # fmt: skip
    proc, port, _ = emulator
    path, body = seed
    raw = noise if noise is not None else json.dumps(mutate(body, changes)).encode()  # big ints too
    if cut is not None:
        raw = raw[:cut]
    status, reply = call(port, "POST", path, raw)
    assert status < 500, reply[:300]
    if status >= 400:
        assert set(orjson.loads(reply)["error"]) == {"message", "type", "param", "code"}
    assert proc.poll() is None


def test_after_the_fuzz_gauges_are_zero_and_the_log_is_clean(
    emulator: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    proc, port, log = emulator
    for _ in range(100):
        text = call(port, "GET", "/metrics")[1].decode()
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("vllm:num_requests_", "vllm:kv_cache_usage_perc"))}  # fmt: skip
        if not any(values.values()):
            break
        time.sleep(0.05)
    assert values == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0, "vllm:kv_cache_usage_perc": 0}
    assert proc.poll() is None
    assert "Traceback" not in log.read_text()
