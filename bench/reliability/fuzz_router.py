"""Fuzz a real `xpyd router` process with >= 10,000 mutated requests; print one markdown table row.

    .venv/bin/python bench/reliability/fuzz_router.py [--requests 10000] [--seed 1] [--budget 100]

The router runs as a subprocess in front of three well-behaved stub workers (one prefill, two
decode, in this process, on 127.0.0.1), so every 5xx is the router's own doing. Requests are
mutated JSON bodies (random fields and values, byte flips, truncations, reserved protocol fields,
oversized bodies), hostile headers (X-Request-Timeout, Content-Type, Authorization) and a share of
malformed raw HTTP. Counted: answers by class, hangs (no answer within 15 s), crashes (the router
exited or logged a traceback). A 504 for a request that lowered its own deadline is the client's
choice and is counted with the 4xx. Stops by itself after `--budget` seconds at most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

XPYD = str(Path(sys.executable).with_name("xpyd"))
HANG_SECONDS = 15.0
KEYS = ["model", "prompt", "messages", "stream", "max_tokens", "max_completion_tokens", "stream_options", "n",
        "temperature", "logprobs", "stop", "vllm_xargs", "kv_transfer_params", "bootstrap_host", "bootstrap_room",
        "data_parallel_rank", "role", "content"]  # fmt: skip
RAW_HTTP = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: nope\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/9.9\r\nHost: r\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n{}{}{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /v1/models\x00 HTTP/1.1\r\n\r\n",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- stub workers ---------------------------------------------------------------------------


async def completion(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    kv = body.get("kv_transfer_params")
    doc: dict[str, Any] = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
    if isinstance(kv, dict) and kv.get("do_remote_decode"):
        doc["kv_transfer_params"] = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1],
                                     "remote_host": "127.0.0.1", "remote_port": 1}  # fmt: skip
        return web.json_response(doc)
    if body.get("stream") is True:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(3):
            await out.write(b'data: {"choices": [{"index": 0, "text": "t%d"}]}\n\n' % i)
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out
    return web.json_response(doc)


async def start_stub() -> tuple[str, web.AppRunner]:
    app = web.Application(client_max_size=1 << 22)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/health", lambda _: web.Response())  # type: ignore[arg-type, return-value]
    app.router.add_get("/metrics", lambda _: web.Response(text="vllm:num_requests_running 0\n"))  # type: ignore[arg-type, return-value]
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


# --- mutations ------------------------------------------------------------------------------


def value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, 2**70, -(2**64)])
    if kind == 3:
        return rng.choice([0.5, -1e308, 1e308, float("inf"), float("nan")])
    if kind == 4:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000), 0xD800])) for _ in range(8))
    if kind == 5:
        return "hello " * rng.choice([1, 10, 700])
    if kind == 6:
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(4))}


def valid(rng: random.Random, chat: bool) -> dict[str, Any]:
    text = "hello " * rng.choice([2, 50, 400])
    body: dict[str, Any] = {"model": "m", "max_tokens": rng.randrange(1, 20), "stream": rng.random() < 0.4}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randrange(1, 5)):
        op, pos = rng.randrange(3), rng.randrange(len(data) + 1)
        if op == 0:
            data[pos:pos] = bytes([rng.randrange(256)])
        elif op == 1:
            del data[pos : pos + rng.randrange(1, 4)]
        else:
            data = data[:pos]
    return bytes(data)


def case(rng: random.Random) -> tuple[str, bytes, dict[str, str]]:
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    kind = rng.randrange(6)
    body: Any = valid(rng, chat)
    if kind == 0:
        body = {rng.choice(KEYS): value(rng) for _ in range(rng.randrange(6))}
    elif kind == 1:
        body[rng.choice(KEYS)] = value(rng)
    elif kind == 2:
        reserved = ["kv_transfer_params", "bootstrap_room", "bootstrap_host", "disaggregated_params"]
        body[rng.choice(reserved)] = value(rng)
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    if kind == 3:
        raw = mutate_bytes(rng, raw)
    elif kind == 4 and rng.random() < 0.05:
        raw = b'{"prompt": "' + b"x" * (1 << 21) + b'"}'  # past --max-body-bytes
    headers: dict[str, str] = {}
    if kind == 5 or rng.random() < 0.2:
        pick = rng.choice(["X-Request-Timeout", "Content-Type", "Authorization", "Accept-Encoding"])
        headers[pick] = rng.choice(["0", "-1", "abc", "1e-9", "0.001", "1e9", "nan", "text/plain", "Bearer x", "gzip"])
    return path, raw, headers


# --- the run --------------------------------------------------------------------------------


@dataclass
class Tally:
    requests: int = 0
    ok: int = 0
    client_errors: int = 0
    server_errors: int = 0
    hangs: int = 0
    dropped: int = 0  # connection closed without an answer (malformed HTTP may deserve no answer)
    samples: list[str] = field(default_factory=list)


def own_deadline(headers: dict[str, str]) -> bool:
    try:
        return 0 < float(headers.get("X-Request-Timeout", "x")) < 10
    except ValueError:
        return False


async def one(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Tally) -> None:
    tally.requests += 1
    if rng.random() < 0.05:
        await raw_http(url, rng.choice(RAW_HTTP), tally)
        return
    path, raw, headers = case(rng)
    try:
        async with asyncio.timeout(HANG_SECONDS), session.post(url + path, data=raw, headers=headers) as resp:
            await resp.read()
            status = resp.status
    except TimeoutError:
        tally.hangs += 1
        return
    except aiohttp.ClientError:
        tally.dropped += 1
        return
    if status < 400:
        tally.ok += 1
    elif status < 500 or (status == 504 and own_deadline(headers)):
        tally.client_errors += 1
    else:
        tally.server_errors += 1
        if len(tally.samples) < 5:
            tally.samples.append(f"{status} {path} {headers} {raw[:120]!r}")


async def raw_http(url: str, payload: bytes, tally: Tally) -> None:
    host, port = url[7:].rsplit(":", 1)
    try:
        async with asyncio.timeout(HANG_SECONDS):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            head = await reader.read(64)
            writer.close()
    except TimeoutError:
        tally.hangs += 1
        return
    except OSError:
        tally.dropped += 1
        return
    code = head[9:12]
    if code.startswith(b"5"):
        tally.server_errors += 1
    elif code.startswith(b"4"):
        tally.client_errors += 1
    elif not head:
        tally.dropped += 1
    else:
        tally.ok += 1


async def run(total: int, seed: int, budget: float, concurrency: int) -> int:
    stubs = [await start_stub() for _ in range(3)]
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="xpyd-fuzz-")) / "router.log"
    cmd = [XPYD, "router", "--host", "127.0.0.1", "--port", str(port), "--prefill", stubs[0][0], "--decode",
           stubs[1][0], stubs[2][0], "--direct-below-chars", "512", "--request-timeout", "10",
           "--max-body-bytes", str(1 << 20), "--log-level", "WARNING"]  # fmt: skip
    with log.open("wb") as out:
        router = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220  # start-up only
    url = f"http://127.0.0.1:{port}"
    tally = Tally()
    started = time.monotonic()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            for _ in range(100):  # wait for it to listen
                if router.poll() is not None:
                    break
                try:
                    async with session.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            rngs = [random.Random(seed * 1000 + i) for i in range(concurrency)]
            per_worker = -(-total // concurrency)

            async def worker(rng: random.Random) -> None:
                for _ in range(per_worker):
                    if time.monotonic() - started > budget or router.poll() is not None:
                        return
                    await one(session, url, rng, tally)

            await asyncio.gather(*(worker(rng) for rng in rngs))
            ready: dict[str, int] = {}
            try:
                async with session.get(url + "/health") as resp:
                    ready = (await resp.json())["ready"] if resp.status == 200 else {}
            except aiohttp.ClientError:
                pass
    finally:
        alive = router.poll() is None
        router.terminate()
        router.wait(10)
        for _, runner in stubs:
            await runner.cleanup()
    text = log.read_text(errors="replace")
    crashes = int(not alive) + text.count("Traceback")
    seconds = time.monotonic() - started
    print("| requests | 2xx | 4xx | 5xx | hangs | dropped | crashes | workers ready after | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    pools = f"{ready.get('prefill', 0)}P{ready.get('decode', 0)}D of 1P2D"
    print(f"| {tally.requests} | {tally.ok} | {tally.client_errors} | {tally.server_errors} | {tally.hangs} | "
          f"{tally.dropped} | {crashes} | {pools} | {seconds:.1f} |")  # fmt: skip
    for sample in tally.samples:
        print("5xx:", sample, file=sys.stderr)
    return 1 if tally.server_errors or tally.hangs or crashes else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=100.0, help="seconds after which no new request starts")
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # the stubs' own complaints about aborted hops
    return asyncio.run(run(args.requests, args.seed, args.budget, args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
