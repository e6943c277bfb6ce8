"""A minimal keep-alive HTTP/1.1 load generator on raw asyncio protocols (faster than any client lib).

Each connection sends one request, waits for the whole response (Content-Length or chunked),
then sends the next; N connections give concurrency N.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast


class _Conn(asyncio.Protocol):
    def __init__(self, request: bytes, stats: dict[str, int], stop_at: float) -> None:
        self.request = request
        self.stats = stats
        self.stop_at = stop_at
        self.buf = bytearray()
        self.need = -1  # total bytes of a Content-Length response, -1 while unknown, -2 when chunked
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need == -1:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            if not head.startswith(b"http/1.1 200"):
                self.stats["errors"] += 1
            pos = head.find(b"content-length:")
            if pos >= 0:
                self.need = end + 4 + int(head[pos + 15 :].split(b"\r\n", 1)[0])
            else:
                self.need = -2
        if (self.need >= 0 and len(self.buf) >= self.need) or (self.need == -2 and self.buf.endswith(b"0\r\n\r\n")):
            if self.stats["sample"] == 0:
                self.stats["sample"] = 1
                self.stats["sample_text_chunks"] = bytes(self.buf).count(b'"text":')
            self.stats["done"] += 1
            self.stats["bytes"] += len(self.buf)
            self.buf = bytearray()
            self.need = -1
            if time.perf_counter() < self.stop_at and self.transport is not None:
                self.transport.write(self.request)
            elif not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def load(host: str, port: int, path: str, body: bytes, concurrency: int, seconds: float) -> dict[str, float]:
    """Drive `concurrency` connections for `seconds`; returns requests/s and counts."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    stats = {"done": 0, "errors": 0, "bytes": 0, "sample": 0, "sample_text_chunks": 0}
    start = time.perf_counter()
    stop_at = start + seconds
    conns = []
    for _ in range(concurrency):
        _, proto = await loop.create_connection(lambda: _Conn(request, stats, stop_at), host, port)
        conns.append(proto)
    await asyncio.gather(*(c.done for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return {"rps": stats["done"] / elapsed, "requests": stats["done"], "errors": stats["errors"],
            "seconds": elapsed, "sample_text_chunks": stats["sample_text_chunks"]}  # fmt: skip
