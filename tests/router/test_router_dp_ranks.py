"""A data-parallel replica end to end: `xpyd router --data-parallel-size 4` in front of an emulated vLLM
replica of 4 ranks, both real processes. The router hears each rank's KV events on its own port,
routes each prompt to one rank and pins it with X-data-parallel-rank, so a prompt sent again finds
its prefix on the rank that computed it; the emulator's per-rank counters say where everything went."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from router_harness import MODEL, XPYD, free_port  # type: ignore[import-not-found]

RANKS = 4


def _free_run(host: str, n: int) -> int:
    """A port p with p..p+n-1 free on `host` (each rank binds port + rank)."""
    for _ in range(50):
        base = random.randint(20_000, 60_000)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind((host, port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def _wait(url: str, proc: subprocess.Popen[bytes], want: int = 200, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")[-2000:]
        try:
            if httpx.get(url, timeout=1).status_code == want:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} not ready"
        time.sleep(0.1)


@pytest.fixture
def replica() -> Iterator[tuple[str, str]]:
    """(router URL, emulator URL): an emulated DP4 vLLM replica publishing KV events, a router on it."""
    host = f"127.0.{random.randint(60, 250)}.{random.randint(2, 250)}"
    events, replay = _free_run(host, RANKS), _free_run(host, RANKS)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}",
              "replay_endpoint": f"tcp://*:{replay}", "topic": "kv-events"}  # fmt: skip
    port, router_port = free_port(host), free_port("127.0.0.1")
    env = dict(os.environ, VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port(host)))
    emulator = subprocess.Popen(
        [XPYD, "emulate", "--zero-delay", "--log-level", "WARNING", "--", "vllm", "serve", MODEL, "--host", host,
         "--port", str(port), "--data-parallel-size", str(RANKS), "--kv-events-config", json.dumps(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    worker = f"http://{host}:{port}"
    router = subprocess.Popen(
        [XPYD, "router", "--worker", worker, "--port", str(router_port), "--tokenizer", "emulator",
         "--kv-events-port", str(events), "--kv-replay-port", str(replay), "--data-parallel-size", str(RANKS),
         "--scrape-interval", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait(worker + "/health", emulator)
        _wait(f"http://127.0.0.1:{router_port}/health", router)
        yield f"http://127.0.0.1:{router_port}", worker
    finally:
        for proc in (router, emulator):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stderr is not None:
                proc.stderr.close()


def _per_engine(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            engine = re.search(r'engine="(\d+)"', line)
            if engine:
                out[engine[1]] = out.get(engine[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _stored(text: str) -> dict[str, float]:
    """Blocks each rank target of the router applied from its rank's BlockStored events, by rank."""
    pattern = r'xpyd_router_kv_event_blocks_total\{[^}]*outcome="stored",worker="[^"]*#dp(\d+)"\} (\S+)'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text) if float(m[2]) > 0}


def test_prompts_come_back_to_the_rank_that_cached_them(replica: tuple[str, str]) -> None:
    router, worker = replica
    prompts = [f"conversation {i}: " + " ".join(f"word{(i * 31 + k) % 997}" for k in range(600)) for i in range(8)]
    with httpx.Client(timeout=30) as client:
        for prompt in prompts:  # first pass: nothing cached anywhere
            r = client.post(router + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200, r.text
        before = _per_engine(client.get(worker + "/metrics").text, "vllm:prefix_cache_hits_total")
        deadline = time.monotonic() + 20  # the router hears every rank's BlockStored events
        while len(stored := _stored(client.get(router + "/metrics").text)) < RANKS:
            assert time.monotonic() < deadline, f"no KV events from every rank: {stored}"
            time.sleep(0.2)
        for prompt in prompts:  # second pass: each prompt back to the rank holding it
            r = client.post(router + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200, r.text
        metrics = client.get(worker + "/metrics").text
    served = _per_engine(metrics, "vllm:request_success_total")
    hits = _per_engine(metrics, "vllm:prefix_cache_hits_total")
    queries = _per_engine(metrics, "vllm:prefix_cache_queries_total")
    assert sum(served.values()) == 2 * len(prompts)
    assert sum(1 for n in served.values() if n) >= 2, f"the router spread the prompts over ranks: {served}"
    second_hits = sum(hits.values()) - sum(before.values())
    second_queries = sum(queries.values()) / 2  # both passes asked for the same prompt tokens
    assert second_hits >= 0.9 * second_queries, (hits, before, queries)
