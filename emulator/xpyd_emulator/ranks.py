"""The emulator's own rank protocol: the pods of a multi-node replica meet their leader and watch each other.

Plain TCP, one JSON object per line (at most MAX_LINE bytes), every read and wait under a timeout.
The leader (the API rank) listens on the group's port (vLLM's data-parallel RPC or master port,
SGLang's dist-init port) on its own address. Every other rank resolves the leader's host name
(the hosts file named by XPYD_HOSTS_FILE first, re-read on each try, then the resolver), connects,
retrying with backoff until its join timeout, and says {"xpyd": "rank", "rank", "nodes", "engine",
"model", "world", "domain"}. The leader answers {"ok": true} or {"ok": false, "error"} (a rank out
of range or already joined, another model or group shape, a group already broken) and closes.
Joined, both sides send {"beat": n} every second; a rank whose connection drops or who falls
silent for the heartbeat timeout breaks the group for good (the leader's /health stays 503 until
it restarts, so LeaderWorkerSet recreates the group). A leader that shuts down says {"bye"}.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

log = logging.getLogger("xpyd.emulator.ranks")
MAX_LINE = 4096  # bytes in one protocol message
MAX_HOSTS_FILE = 1 << 20  # bytes read from XPYD_HOSTS_FILE
HELLO_TIMEOUT = 5.0  # seconds for the hello and its answer
CONNECT_TIMEOUT = 3.0
HOSTS_FILE_ENV = "XPYD_HOSTS_FILE"


class RankExit(Exception):
    """A non-API rank must end: `code` 0 when its leader said goodbye, 1 when it lost or never found it."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def encode(message: Mapping[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


async def receive(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, None at end of stream; ValueError for a line too long or not a JSON object."""
    line = await reader.readline()  # the reader's limit bounds it (ValueError past MAX_LINE)
    if not line:
        return None
    doc = orjson.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def hosts_lookup(name: str, path: str) -> str | None:
    """The address an /etc/hosts-format file gives `name` (or a longer name it abbreviates), else None."""
    with open(path, "rb") as f:
        text = f.read(MAX_HOSTS_FILE).decode("utf-8", "replace")
    want = name.lower().rstrip(".")
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        names = [n.lower().rstrip(".") for n in fields[1:]]
        if len(fields) >= 2 and any(n == want or n.startswith(want + ".") for n in names):
            return fields[0]
    return None


def resolve(name: str, env: Mapping[str, str]) -> str:
    """`name` as an address: itself when it is one, else the hosts file's entry, else the name (resolver)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(name.strip("[]")))
    path = env.get(HOSTS_FILE_ENV)
    if path:
        found = hosts_lookup(name, path)
        if found:
            return found
    return name


@dataclass(frozen=True, slots=True)
class Identity:
    """What a rank says about itself; the leader requires the same engine, model, group size and world."""

    rank: int
    nodes: int
    engine: str
    model: str
    world: int
    domain: str | None

    def hello(self) -> dict[str, Any]:
        return {"xpyd": "rank", "rank": self.rank, "nodes": self.nodes, "engine": self.engine,
                "model": self.model, "world": self.world, "domain": self.domain}  # fmt: skip


def beat_interval(timeout: float) -> float:
    return min(1.0, timeout / 4)


async def heartbeats(writer: asyncio.StreamWriter, interval: float) -> None:
    """Send {"beat": n} every `interval` seconds until the connection fails or the task is cancelled."""
    n = 0
    with contextlib.suppress(OSError, TimeoutError):
        while True:
            writer.write(encode({"beat": n}))
            await asyncio.wait_for(writer.drain(), interval * 4)
            n += 1
            await asyncio.sleep(interval)


async def watch(reader: asyncio.StreamReader, silence: float) -> tuple[str, dict[str, Any] | None]:
    """Read the peer's messages until it goes (or is `silence` seconds quiet): (why, its {"bye"} or None)."""
    try:
        while True:
            message = await asyncio.wait_for(receive(reader), silence)
            if message is None:
                return "connection closed", None
            if "bye" in message:
                return f"said goodbye: {str(message['bye'])[:200]}", message
    except TimeoutError:
        return f"silent for {silence:g} s", None
    except (OSError, ValueError) as exc:
        return f"connection failed ({exc})", None


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


async def join_leader(
    host: str, port: int, me: Identity, env: Mapping[str, str], join_timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the leader and join, retrying with backoff; raises RankExit when refused or out of time."""
    loop = asyncio.get_running_loop()
    deadline, delay, last = loop.time() + join_timeout, 0.1, "not tried"
    while (left := deadline - loop.time()) > 0:
        try:
            address = resolve(host, env)
            connect = asyncio.open_connection(address, port, limit=MAX_LINE)
            reader, writer = await asyncio.wait_for(connect, min(CONNECT_TIMEOUT, left))
            try:
                writer.write(encode(me.hello()))
                await asyncio.wait_for(writer.drain(), HELLO_TIMEOUT)
                reply = await asyncio.wait_for(receive(reader), HELLO_TIMEOUT)
            except BaseException:
                await close(writer)
                raise
            if reply is not None and reply.get("ok") is True:
                return reader, writer
            await close(writer)
            if reply is not None:
                raise RankExit(f"the leader {host}:{port} refused rank {me.rank}: {str(reply.get('error'))[:300]}")
            last = "the leader closed the connection"
        except (OSError, TimeoutError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, 2.0)
    raise RankExit(f"could not join the leader {host}:{port} within {join_timeout:g} s (last try: {last})")


async def stay_joined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, silence: float) -> RankExit:
    """Heartbeat with the leader until it goes (or is `silence` seconds quiet); the RankExit to end with."""
    beats = asyncio.create_task(heartbeats(writer, beat_interval(silence)))
    try:
        why, bye = await watch(reader, silence)
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await close(writer)
    return RankExit(f"the leader {why}", 0) if bye is not None else RankExit(f"lost the leader ({why})")


OnComplete = Callable[[list[str | None]], None]
