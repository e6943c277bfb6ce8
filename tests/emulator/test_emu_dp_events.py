"""Per-rank KV events of a vLLM data-parallel replica: rank r on port + r, and a headless member's relay."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
from emu_harness import make_config, running  # type: ignore[import-not-found]
from test_emu_kv_events import DECODE, BlockStored  # type: ignore[import-not-found]

from xpyd_emulator.dp_routing import HEADER
from xpyd_emulator.kv_publisher import END_SEQ
from xpyd_emulator.tokens import block_hashes_text, token_ids

HOST = "127.0.0.1"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
XPYD = str(Path(sys.executable).with_name("xpyd"))
TOPIC = b"kv-events"


def port_run(n: int, *hosts: str) -> int:
    """A first port of `n` consecutive ports free on every one of `hosts`."""
    for base in range(20000 + os.getpid() % 500 * 20, 32700, 37):
        socks: list[socket.socket] = []
        try:
            for host in hosts:
                for port in range(base, base + n):
                    s = socket.socket()
                    socks.append(s)
                    s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


def events_config(port: int, replay: int) -> str:
    return (f'{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{port}","replay_endpoint":"tcp://*:{replay}",'
            f'"topic":"kv-events"}}')  # fmt: skip


def replay(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, start: int = 0) -> list[tuple[int, Any]]:
    """Every buffered batch from `start` on, as (seq, decoded batch), via vLLM's replay protocol."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[tuple[int, Any]] = []
        while True:
            assert dealer.poll(5000), f"no replay answer from {endpoint}"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), DECODE(payload)))
    finally:
        dealer.close()


async def until_batch(sub: zmq.Socket[bytes], poke: Callable[[], Awaitable[None]], seconds: float = 10) -> list[bytes]:
    """Poke (send a request) until the subscriber gets a batch: covers ZMQ's slow joiner without a fixed sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        await poke()
        if await asyncio.to_thread(sub.poll, 200):
            return sub.recv_multipart()
    raise AssertionError(f"no KV event batch within {seconds} s")


def subscriber(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(endpoint)
    return sub


async def complete(http: aiohttp.ClientSession, base: str, prompt: str, rank: int) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(base + "/v1/completions", json=body, headers={HEADER: str(rank)}) as resp:
        assert resp.status == 200, await resp.text()


def prompt(i: int) -> str:
    return f"prompt number {i} that fills a few blocks " * 8  # 3+ blocks of 16 tokens


async def test_each_rank_publishes_on_its_own_port_with_its_rank_and_sequence() -> None:
    port = port_run(8, HOST)
    rep = port + 4
    cfg = make_config(HOST, MODEL, "-dp", "4", "--kv-events-config", events_config(port, rep), zero_delay=True)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with running(cfg) as base, aiohttp.ClientSession() as http:
            sub3 = subscriber(ctx, f"tcp://{HOST}:{port + 3}")
            n = iter(range(1000))
            topic, seq, payload = await until_batch(sub3, lambda: complete(http, base, prompt(next(n)), 3))
            assert topic == TOPIC and DECODE(payload).data_parallel_rank == 3
            sent3 = next(n)  # the requests rank 3 got so far: one batch each
            for i in (1000, 1001):
                await complete(http, base, prompt(i), 1)
            await complete(http, base, prompt(2000), 0)
            batches = {r: await asyncio.to_thread(replay, ctx, f"tcp://{HOST}:{rep + r}") for r in range(4)}
            sub3.close()
    finally:
        ctx.destroy(linger=0)
    assert [s for s, _ in batches[1]] == [0, 1] and [s for s, _ in batches[0]] == [0]  # per-rank sequences
    assert [s for s, _ in batches[3]] == list(range(sent3)) and batches[2] == []
    assert int.from_bytes(seq, "big") == sent3 - 1
    for r in (0, 1, 3):
        assert {b.data_parallel_rank for _, b in batches[r]} == {r}
    text = prompt(1001)
    ids, hashes = token_ids(text), block_hashes_text(text, 16)
    full = len(hashes) * 16
    assert batches[1][1][1].events == [BlockStored(hashes, None, ids[:full].tolist(), 16, None, "GPU", None)]


def test_an_endpoint_vllm_cannot_offset_fails_at_start() -> None:
    config = '{"enable_kv_cache_events":true,"endpoint":"ipc:///tmp/xpyd-kv-test"}'
    cfg = make_config(HOST, MODEL, "-dp", "2", "--kv-events-config", config, zero_delay=True)

    async def serve() -> None:
        async with running(cfg):
            pass

    with pytest.raises(OSError, match="cannot be offset per data-parallel rank"):
        asyncio.run(serve())


LEADER, MEMBER = "127.0.0.61", "127.0.0.62"
LEADER_NAME = "dp-leader-0.dp.default"


async def _wait_health(http: aiohttp.ClientSession, base: str, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        try:
            async with http.get(base + "/health") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{base} not healthy within {seconds} s")


async def test_a_headless_member_serves_its_ranks_events_and_replay(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{LEADER} {LEADER_NAME}\n")
    http_port = port_run(10, LEADER, MEMBER)
    rpc, port, rep = http_port + 1, http_port + 2, http_port + 6
    engine = ["vllm", "serve", MODEL, "--port", str(http_port), "--data-parallel-size", "4",
              "--data-parallel-size-local", "2", "--data-parallel-address", LEADER_NAME,
              "--data-parallel-rpc-port", str(rpc), "--kv-events-config", events_config(port, rep)]  # fmt: skip
    flags = ["--log-level", "WARNING", "--heartbeat-timeout", "2", "--join-timeout", "20", "--zero-delay"]
    procs: list[asyncio.subprocess.Process] = []
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for host, extra in ((LEADER, []), (MEMBER, ["--headless", "--data-parallel-start-rank", "2"])):
            env = dict(os.environ, XPYD_BIND_HOST=host, XPYD_HOSTS_FILE=str(hosts))
            procs.append(await asyncio.create_subprocess_exec(XPYD, "emulate", *flags, "--", *engine, *extra, env=env,
                                                              stderr=asyncio.subprocess.PIPE))  # fmt: skip
        base = f"http://{LEADER}:{http_port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await _wait_health(http, base, 20)  # both joined
            sub = subscriber(ctx, f"tcp://{MEMBER}:{port + 3}")  # rank 3 lives on the member
            n = iter(range(1000))
            topic, seq, payload = await until_batch(sub, lambda: complete(http, base, prompt(next(n)), 3))
            assert topic == TOPIC and DECODE(payload).data_parallel_rank == 3
            await complete(http, base, prompt(5000), 2)
            await complete(http, base, prompt(5001), 0)
            at_member = await asyncio.to_thread(replay, ctx, f"tcp://{MEMBER}:{rep + 2}")
            at_leader = await asyncio.to_thread(replay, ctx, f"tcp://{LEADER}:{rep + 2}")
            leader0 = await asyncio.to_thread(replay, ctx, f"tcp://{LEADER}:{rep}")
            rank3 = await asyncio.to_thread(replay, ctx, f"tcp://{MEMBER}:{rep + 3}", int.from_bytes(seq, "big"))
            sub.close()
        assert [(s, b.data_parallel_rank) for s, b in at_member] == [(0, 2)]
        assert msgspec.msgpack.encode(at_member) == msgspec.msgpack.encode(at_leader)  # the leader's batch, relayed
        assert [(s, b.data_parallel_rank) for s, b in leader0] == [(0, 0)]
        assert rank3[0][0] == int.from_bytes(seq, "big") and rank3[0][1].data_parallel_rank == 3
        member = procs[1]
        member.send_signal(signal.SIGTERM)  # the relay stops with it: a clean exit
        _, err = await asyncio.wait_for(member.communicate(), 10)
        assert member.returncode == 0, err.decode()[-2000:]
    finally:
        ctx.destroy(linger=0)
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        for proc in procs:
            await asyncio.wait_for(proc.wait(), 10)
