"""HTTP stack choice by measurement: CPU per request of candidate clients and servers on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from procs import BIN, MODEL, Procs, cpu_seconds, free_port, wait_http, wait_port  # type: ignore[import-not-found]

BODY = json.dumps({"model": MODEL, "prompt": "hello " * 40, "max_tokens": 4})

CLIENTS = {
    "aiohttp.ClientSession": """
        async def make():
            s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            async def post():
                async with s.post(URL + "/v1/completions", data=BODY, headers=H) as r:
                    await r.read()
            return post, s.close
    """,
    "xpyd_router.http.upstream (httptools)": """
        async def make():
            u = Upstream()
            async def post():
                r = await u.post(URL, "/v1/completions", BODY.encode())
                await r.read()
                r.close()
            async def close():
                u.close()
            return post, close
    """,
    "httpx.AsyncClient": """
        async def make():
            c = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
            async def post():
                r = await c.post(URL + "/v1/completions", content=BODY, headers=H)
                r.read()
            return post, c.aclose
    """,
}

CLIENT_MAIN = """
import asyncio, sys, time, aiohttp, httpx, uvloop
from xpyd_router.http.upstream import Upstream
URL, BODY, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
H = {"Content-Type": "application/json"}
%s
async def main():
    post, close = await make()
    async def worker(k):
        for _ in range(k):
            await post()
    await asyncio.gather(*(worker(N // 64 // 4) for _ in range(64)))  # warm-up
    start = time.process_time()
    await asyncio.gather(*(worker(N // 64) for _ in range(64)))
    print((time.process_time() - start) / (N // 64 * 64) * 1e6)
    await close()
with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
    r.run(main())
"""

SERVERS = {
    "xpyd_router.http.server (httptools)": """
        import asyncio, uvloop
        from xpyd_http.messages import Reply
        from xpyd_http.server import Server
        async def h(request):
            await request.read()
            return Reply(200, PAYLOAD)
        async def main():
            await Server({("POST", "/v1/completions"): h}).listen("127.0.0.1", PORT)
            await asyncio.Event().wait()
        uvloop.run(main())
    """,
    "aiohttp.web + uvloop": """
        from aiohttp import web
        async def h(request):
            await request.read()
            return web.Response(body=PAYLOAD, content_type="application/json")
        app = web.Application(); app.router.add_post("/v1/completions", h)
        import uvloop; uvloop.install()
        web.run_app(app, host="127.0.0.1", port=PORT, access_log=None, print=None)
    """,
    "starlette + uvicorn (uvloop, httptools)": """
        from starlette.applications import Starlette
        from starlette.responses import Response
        from starlette.routing import Route
        async def h(request):
            await request.body()
            return Response(PAYLOAD, media_type="application/json")
        import uvicorn
        uvicorn.run(Starlette(routes=[Route("/v1/completions", h, methods=["POST"])]), host="127.0.0.1",
                    port=PORT, loop="uvloop", http="httptools", log_level="error")
    """,
}


def _client(name: str, url: str, n: int) -> float:
    code = CLIENT_MAIN % textwrap.dedent(CLIENTS[name])
    out = subprocess.run([str(BIN / "python"), "-c", code, url, BODY, str(n)], capture_output=True, check=True)
    return float(out.stdout.decode().strip().splitlines()[-1])


def run(logdir: Path, n: int = 3000) -> dict[str, Any]:
    procs = Procs(logdir)
    result: dict[str, Any] = {"client_cpu_us": {}, "server_cpu_us": {}}
    try:
        emu = procs.emulator("stack-emu", "127.0.84.2", zero_delay=True)
        wait_http(emu.url, proc=emu)
        for name in CLIENTS:
            try:
                result["client_cpu_us"][name] = round(_client(name, emu.url, n), 1)
            except subprocess.CalledProcessError as exc:
                result["client_cpu_us"][name] = f"failed: {exc.stderr.decode()[-200:]}"
        payload = b'{"id":"x","choices":[{"text":" the cat sat"}]}'
        for name, code in SERVERS.items():
            port = free_port("127.0.0.1")
            src = f"PORT = {port}\nPAYLOAD = {payload!r}\n" + textwrap.dedent(code)
            proc = procs.spawn("stack-server", f"http://127.0.0.1:{port}", [str(BIN / "python"), "-c", src])
            wait_port(proc.url)
            before = cpu_seconds(proc.popen.pid)
            _client("xpyd_router.http.upstream (httptools)", proc.url, n)
            spent = cpu_seconds(proc.popen.pid) - before
            result["server_cpu_us"][name] = round(spent / (n * 1.25) * 1e6, 1)
            proc.stop()
    finally:
        procs.stop_all()
    return result


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp")), indent=2))
