"""SGLang's prefill-decode pairing: the prefill's bootstrap server and the decode's wait for a room.

SGLang sends one request to both workers at once, tagged with `bootstrap_host`, `bootstrap_port`
and `bootstrap_room`. The prefill publishes the room when its prefill finishes; the decode
long-polls the prefill's bootstrap server for the room (a real loopback call), then models the
KV handoff and decodes. Unclaimed rooms expire like NixlConnector leases.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from xpyd_emulator.errors import ApiError
from xpyd_emulator.listener import Limits, make_server
from xpyd_emulator.peers import MAX_ROOM, Bootstrap, PeerPolicy, url_host
from xpyd_http.messages import Reply, Request
from xpyd_http.server import Server

ROOM_PATH = "/xpyd/bootstrap/room/{room}"
ROOM_PREFIX = ROOM_PATH.partition("{")[0]
BOOTSTRAP_MAX_BODY = 4096


@dataclass(slots=True)
class Room:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    info: dict[str, Any] = field(default_factory=dict)
    expires: float = 0.0


class RoomTable:
    """Rooms whose prefill finished (or that a decode already waits for)."""

    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self._rooms: dict[int, Room] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def _room(self, room: int, now: float) -> Room:
        entry = self._rooms.get(room)
        if entry is None:
            entry = self._rooms[room] = Room(expires=now + self.lease_seconds)
        return entry

    def publish(self, room: int, info: dict[str, Any], now: float) -> None:
        """The prefill of `room` is done; `info` tells the decode what to model."""
        entry = self._room(room, now)
        entry.info = info
        entry.expires = now + self.lease_seconds
        entry.ready.set()

    async def claim(self, room: int, wait_seconds: float) -> dict[str, Any] | None:
        """Wait up to `wait_seconds` for the room's prefill; hands it over once (None if it never came)."""
        loop = asyncio.get_running_loop()
        entry = self._room(room, loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(entry.ready.wait(), wait_seconds)
        if self._rooms.get(room) is entry:
            del self._rooms[room]
        return entry.info if entry.ready.is_set() else None

    def published(self) -> int:
        """Rooms prefilled here that no decode has claimed yet (a draining prefill waits for them)."""
        return sum(1 for r in self._rooms.values() if r.ready.is_set())

    def expire(self, now: float) -> int:
        gone = [k for k, r in self._rooms.items() if r.expires <= now and r.ready.is_set()]
        for key in gone:
            del self._rooms[key]
        return len(gone)


def bootstrap_server(rooms: RoomTable, peers: PeerPolicy, limits: Limits) -> Server:
    """The prefill's bootstrap server (SGLang's --disaggregation-bootstrap-port), for allowed peers only."""

    def reply(status: int, message: str) -> Reply:
        return Reply(status, ApiError(message, status).body())

    async def room(request: Request) -> Reply:
        """GET ROOM_PATH (the server's fallback: the path holds the room)."""
        number_text = request.path.removeprefix(ROOM_PREFIX)
        if number_text == request.path or not number_text or "/" in number_text:
            raise ApiError(f"no route {request.method} {request.path[:100]}", status=404)
        if request.method not in ("GET", "HEAD"):
            raise ApiError(f"{request.method} is not allowed on {request.path[:100]}; use GET.", status=405)
        remote = request.remote or ""
        if not peers.allows(remote):
            return reply(403, f"{remote} is not a KV peer of this worker")
        try:
            number = int(number_text)
            timeout = float(request.query.get("timeout", "30"))
        except ValueError:
            return reply(400, "room and timeout must be numbers")
        if not 0 <= number <= MAX_ROOM or not 0 <= timeout <= 600:  # also rejects nan
            return reply(400, f"room must be in [0, {MAX_ROOM}] and timeout in [0, 600] seconds")
        info = await rooms.claim(number, timeout)
        if info is None:
            return reply(404, f"bootstrap room {number} never prefilled")
        return Reply(200, orjson.dumps(info))

    return make_server({}, limits, max_body=BOOTSTRAP_MAX_BODY, fallback=room)


async def wait_room(session: aiohttp.ClientSession, where: Bootstrap, wait_seconds: float) -> dict[str, Any]:
    """The decode side: long-poll the prefill's bootstrap server until the room is prefilled."""
    host, port, room = where.host, where.port, where.room
    url = f"http://{url_host(host)}:{port}{ROOM_PATH.format(room=room)}"
    try:
        async with session.get(url, params={"timeout": str(wait_seconds)},
                               timeout=aiohttp.ClientTimeout(total=wait_seconds + 5)) as resp:  # fmt: skip
            body = await resp.read()
            if resp.status != 200:
                raise ApiError(f"KV transfer for bootstrap room {room} from {host}:{port} failed", status=500)
            info = orjson.loads(body)
            if not isinstance(info, dict):
                raise ApiError(f"bootstrap server {host}:{port} sent a malformed room", status=500)
            return info
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ApiError(f"bootstrap server {host}:{port} unreachable: {exc!r}", status=500) from None
