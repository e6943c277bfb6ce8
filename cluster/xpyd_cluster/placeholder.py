"""A stand-in container for images the local cluster cannot run: answers HTTP 200 on its ports."""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "path": request.path, "host": request.host})


async def serve(host: str, ports: list[int]) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _ok)
    runner = web.AppRunner(app)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("ports", nargs="+", type=int)
    ns = parser.parse_args(argv)
    asyncio.run(serve(ns.host, ns.ports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
