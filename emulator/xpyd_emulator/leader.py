"""The leader's side of the rank protocol (ranks.py): who has joined, and whether the group still stands.

The API rank of a multi-node replica listens on the group's port. Its `/health` asks `problem()`:
"waiting for ranks ..." until every rank 1..N-1 has joined, then nothing, and once a joined rank is
lost (connection dropped, heartbeats stopped) a reason that never clears, so the liveness probe
restarts the leader and LeaderWorkerSet recreates the whole group, as it would for a real engine
whose NCCL group lost a member. Connections that are not ranks are dropped after HELLO_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from xpyd_emulator.ranks import (
    HELLO_TIMEOUT,
    MAX_LINE,
    Identity,
    OnComplete,
    beat_interval,
    close,
    encode,
    heartbeats,
    receive,
    watch,
)

log = logging.getLogger("xpyd.emulator.ranks")


class GroupLeader:
    """Rank 0's registry of ranks 1..N-1 and the server they join."""

    def __init__(
        self, me: Identity, host: str, port: int, timeout: float, on_complete: OnComplete | None = None
    ) -> None:
        self.me, self.host, self.port, self.timeout = me, host, port, timeout
        self.on_complete = on_complete
        self.joined: dict[int, str | None] = {}  # rank -> its NVLink domain
        self.broken: str | None = None
        self.max_pending = 4 * me.nodes + 16
        self._pending = 0
        self._writers: set[asyncio.StreamWriter] = set()  # every open connection
        self._members: set[asyncio.StreamWriter] = set()  # joined ranks
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on host:port (raises OSError when it cannot)."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port, limit=MAX_LINE)
        log.info("leader of a %d-node group: ranks join on %s:%d", self.me.nodes, self.host, self.port)

    async def stop(self) -> None:
        """Stop listening; tell every joined rank goodbye and close it."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._members):
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(encode({"bye": "the leader is shutting down"}))
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    @property
    def complete(self) -> bool:
        return self.broken is None and len(self.joined) == self.me.nodes - 1

    def problem(self) -> str | None:
        """Why the replica cannot serve: ranks still missing, or a rank lost (for good); None when whole."""
        if self.broken is not None:
            return self.broken
        missing = [r for r in range(1, self.me.nodes) if r not in self.joined]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            return (f"waiting for ranks {shown} of this {self.me.nodes}-node replica to join on port {self.port} "
                    f"({len(self.joined)}/{self.me.nodes - 1} joined)")  # fmt: skip
        return None

    def _refusal(self, hello: dict[str, Any] | None) -> str | None:
        if hello is None or hello.get("xpyd") != "rank":
            return "not an xpyd rank hello"
        rank, me = hello.get("rank"), self.me
        if type(rank) is not int or not 1 <= rank < me.nodes:
            return f"rank {str(rank)[:20]} is out of range 1..{me.nodes - 1}"
        for key in ("nodes", "engine", "model", "world"):
            if hello.get(key) != getattr(me, key):
                return f"rank {rank} has {key} {str(hello.get(key))[:100]!r}, the leader {getattr(me, key)!r}"
        if self.broken is not None:
            return f"this group is broken ({self.broken})"
        if rank in self.joined:
            return f"rank {rank} has already joined"
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's connection callback: serve the connection in a task stop() may cancel."""
        if self._pending >= self.max_pending:
            writer.close()
            return
        self._pending += 1
        self._writers.add(writer)
        task = asyncio.create_task(self._connection(reader, writer))
        self._tasks.add(task)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            self._pending -= 1
            self._tasks.discard(task)
            self._writers.discard(writer)
            await close(writer)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await asyncio.wait_for(receive(reader), HELLO_TIMEOUT)
        except (OSError, TimeoutError, ValueError):
            hello = None
        refusal = self._refusal(hello)
        if refusal is None and hello is not None:
            await self._member(hello["rank"], hello.get("domain"), reader, writer)
            return
        log.warning("refused a rank from %s: %s", writer.get_extra_info("peername"), refusal)
        with contextlib.suppress(OSError, TimeoutError):
            writer.write(encode({"ok": False, "error": refusal}))
            await asyncio.wait_for(writer.drain(), 1.0)

    async def _member(self, rank: int, domain: object, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:  # fmt: skip
        self.joined[rank] = domain if isinstance(domain, str) and domain else None
        self._members.add(writer)
        writer.write(encode({"ok": True, "nodes": self.me.nodes}))
        log.info("rank %d joined (%d/%d)", rank, len(self.joined), self.me.nodes - 1)
        if self.complete and self.on_complete is not None:
            self.on_complete([self.me.domain, *self.joined.values()])
        beats = asyncio.create_task(heartbeats(writer, beat_interval(self.timeout)))
        try:
            why, _ = await watch(reader, self.timeout)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            self._members.discard(writer)
        if self.broken is None:
            self.broken = f"rank {rank} left the group ({why}); restart this replica (its group must be recreated)"
            log.error("%s", self.broken)
