"""Fire >= 10,000 mutated requests at one `xpyd emulate` and print what happened as a markdown table row.

    python bench/reliability/fuzz_emulator.py [--requests 10000] [--concurrency 32] [--deadline 110]

Mutations: JSON fields set to odd values or dropped (kv_transfer_params included), truncated and
random bodies, malformed HTTP on raw sockets (bad request lines and headers, bodies shorter than
their Content-Length, dripped headers), and clients that abort mid-stream or mid-queue. Columns:
2xx/4xx/5xx replies, `closed` (the worker cut a slow or broken connection without a reply),
`aborted` (the client gave up on purpose), `hangs` (no reply within 10 s), `crashes` (the
worker process died or refused connections), and the running/waiting gauges once it is idle.
Everything stays on loopback; the run stops by itself after --deadline seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import aiohttp

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KV = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute"}'
HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
       "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
SEEDS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": MODEL, "prompt": "hello world " * 10, "max_tokens": 8}),
    ("/v1/completions", {"prompt": [1, 2, 3] * 20, "max_tokens": 4, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "yo"}], "stream": True,
                              "stream_options": {"include_usage": True}, "max_completion_tokens": 5}),
    ("/v1/completions", {"prompt": "prefill me " * 30, "max_tokens": 1, "kv_transfer_params": HOP}),
]  # fmt: skip
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
          "temperature", "top_p", "n", "kv_transfer_params", "bootstrap_host", "bootstrap_room"]  # fmt: skip
KV_FIELDS = ["do_remote_decode", "do_remote_prefill", "remote_engine_id", "remote_block_ids", "remote_host",
             "remote_port", "tp_size"]  # fmt: skip
ODD: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**64 + 1, 1e308, -0.5, "", "x" * 3000, "127.0.0.1",
                  "169.254.169.254", "evil.example", [], [0], [True], list(range(500)), {}, {"a": [1]},
                  [[1], [2]]]  # fmt: skip
RAW_HTTP = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{"prompt"',
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\nConnection: close\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",  # headers never finish
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello
]
HANG_SECONDS = 10.0


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def odd_value(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(ODD)
    if roll < 0.7:
        return rng.randint(-(2**40), 2**40)
    if roll < 0.85:
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 20)))
    return [odd_value(rng) for _ in range(rng.randint(0, 3))]


def mutated_body(rng: random.Random, peer: str) -> tuple[str, bytes]:
    path, seed = rng.choice(SEEDS)
    body = dict(seed)
    for _ in range(rng.randint(1, 4)):
        roll, field = rng.random(), rng.choice(FIELDS)
        if roll < 0.45:
            body[field] = odd_value(rng)
        elif roll < 0.6:
            body.pop(field, None)
        else:
            kv = body.get("kv_transfer_params")
            kv = dict(kv) if isinstance(kv, dict) else {"do_remote_prefill": True, "remote_engine_id": "e",
                                                         "remote_block_ids": [0], "remote_host": peer,
                                                         "remote_port": 5600}  # fmt: skip
            kv[rng.choice(KV_FIELDS)] = odd_value(rng)
            body["kv_transfer_params"] = kv
    raw = json.dumps(body).encode()
    if rng.random() < 0.1:
        raw = raw[: rng.randint(0, len(raw))]
    elif rng.random() < 0.05:
        raw = rng.randbytes(rng.randint(0, 64))
    return path, raw


async def json_request(http: aiohttp.ClientSession, base: str, rng: random.Random, peer: str) -> str:
    path, raw = mutated_body(rng, peer)
    abort = rng.random() < 0.08
    timeout = aiohttp.ClientTimeout(total=rng.uniform(0.001, 0.05) if abort else HANG_SECONDS)
    try:
        async with http.post(base + path, data=raw, timeout=timeout) as resp:
            if abort and resp.status == 200 and resp.content_type == "text/event-stream":
                await resp.content.readany()
                resp.close()  # mid-stream abort
                return "aborted"
            await resp.read()
            return f"{resp.status // 100}xx"
    except TimeoutError:
        return "aborted" if abort else "hangs"
    except aiohttp.ClientConnectorError:
        return "crashes"
    except aiohttp.ClientError:
        return "closed"


async def raw_request(host: str, port: int, rng: random.Random) -> str:
    payload = rng.choice(RAW_HTTP)
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return "crashes"
    try:
        writer.write(payload)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), HANG_SECONDS)
    except TimeoutError:
        return "hangs"
    except OSError:
        return "closed"
    finally:
        writer.close()
    if not data:
        return "closed"
    return f"{int(data.split(maxsplit=2)[1]) // 100}xx"


async def gauges(http: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    async with http.get(base + "/metrics") as resp:
        text = await resp.text()
    found = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("vllm:num_requests_")}  # fmt: skip
    return found["vllm:num_requests_running"], found["vllm:num_requests_waiting"]


async def hammer(args: argparse.Namespace, base: str, port: int) -> tuple[Counter[str], float, float]:
    """Send the mutated requests; returns the outcome counts and the gauges once idle."""
    host, peer, counts, rng = args.host, args.peer, Counter[str](), random.Random(args.seed)
    stop_at = time.monotonic() + args.deadline
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as http:
        for _ in range(500):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.02)
        issued = 0

        async def one() -> None:
            nonlocal issued
            while issued < args.requests and time.monotonic() < stop_at:
                issued += 1
                use_raw = rng.random() < 0.1
                outcome = await (raw_request(host, port, rng) if use_raw else json_request(http, base, rng, peer))
                counts[outcome] += 1
                counts["requests"] += 1

        await asyncio.gather(*(one() for _ in range(args.concurrency)))
        running = waiting = -1.0
        for _ in range(40):
            with contextlib.suppress(aiohttp.ClientError):
                running, waiting = await gauges(http, base)
            if (running, waiting) == (0, 0):
                break
            await asyncio.sleep(0.05)
    return counts, running, waiting


async def fuzz(args: argparse.Namespace) -> int:
    port = free_port(args.host)
    env = dict(os.environ, XPYD_BIND_HOST=args.host, XPYD_SPEEDUP="2000", XPYD_KV_PEERS=args.peer,
               XPYD_KV_LEASE_SECONDS="0.5", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port(args.host)))  # fmt: skip
    cmd = [sys.executable, "-m", "xpyd_cli.main", "emulate", "--log-level", "ERROR", "--header-timeout", "0.5",
           "--body-timeout", "0.5", "--drain-timeout", "2", "--", "vllm", "serve", MODEL, "--port", str(port),
           "--max-model-len", "2048", "--num-gpu-blocks-override", "512", "--kv-transfer-config", KV]  # fmt: skip
    start = time.monotonic()
    with tempfile.TemporaryFile() as log:  # not a pipe: a worker logging a lot must never block on it
        proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            counts, running, waiting = await hammer(args, f"http://{args.host}:{port}", port)
            counts["crashes"] += proc.returncode is not None
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.seek(0)
        tracebacks = log.read().decode(errors="replace").count("Traceback")
    seconds = time.monotonic() - start
    columns = ["requests", "2xx", "4xx", "5xx", "closed", "aborted", "hangs", "crashes"]
    print("| " + " | ".join(columns) + " | tracebacks | gauges after (running/waiting) | seconds |")
    print("|" + "---:|" * (len(columns) + 3))
    cells = [str(counts[c]) for c in columns] + [str(tracebacks), f"{running:g}/{waiting:g}", f"{seconds:.1f}"]
    print("| " + " | ".join(cells) + " |")
    bad = counts["5xx"] + counts["hangs"] + counts["crashes"] + tracebacks + (running != 0) + (waiting != 0)
    return 1 if bad or counts["requests"] < args.requests else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--deadline", type=float, default=110.0, help="stop after this many seconds regardless")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--host", default="127.0.0.81")
    p.add_argument("--peer", default="127.0.0.82", help="the only allowed KV peer (nothing listens there)")
    return asyncio.run(fuzz(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
