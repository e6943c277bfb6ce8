"""SGLang's handoff: the same request to prefill and decode at once, paired through a bootstrap room.

Both workers get the client's request with `bootstrap_host` (the prefill worker's host),
`bootstrap_port` (its bootstrap server) and one random `bootstrap_room`; the decode worker pulls the
KV from the prefill worker the room names. The prefill leg is not streamed and its answer unused; it
is cancelled once decode has answered, and a failure of it only counts against its worker.
"""

from __future__ import annotations

import asyncio
import random

import orjson

from xpyd_http.messages import Answer
from xpyd_router.handoff.base import Handoff, HopFailed, JsonObj, Legs


def bootstrap_bodies(body: JsonObj, prefill_url: str, bootstrap_port: int) -> tuple[bytes, bytes]:
    """The prefill and decode bodies: the same request, paired through the prefill's bootstrap server."""
    host = prefill_url.split("://", 1)[1].rsplit(":", 1)[0]
    hop = dict(body)
    hop.update(bootstrap_host=host, bootstrap_port=bootstrap_port, bootstrap_room=random.getrandbits(63))
    prefill = dict(hop, stream=False)
    prefill.pop("stream_options", None)
    return orjson.dumps(prefill), orjson.dumps(hop)


def _unused(_: bytes) -> None:
    """SGLang's prefill answer carries nothing decode needs."""


class Bootstrap(Handoff):
    """Prefill and decode sent together; the answer is decode's."""

    name = "bootstrap"

    def __init__(self, bootstrap_port: int) -> None:
        self.bootstrap_port = bootstrap_port

    async def run(self, legs: Legs, body: JsonObj, prefill: str, decode: str) -> Answer:
        first, second = bootstrap_bodies(body, prefill, self.bootstrap_port)
        task = asyncio.create_task(legs.prefill(prefill, first, _unused))
        try:
            return await legs.decode(decode, second)
        finally:
            if not task.done():
                task.cancel()
            outcome: list[object] = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome[0], HopFailed):
                legs.blame(outcome[0])
