"""The NixlConnector stand-in: leases on prefilled blocks, the side channel, and the decode's pull.

A prefill with `do_remote_decode` keeps its prompt's blocks pinned under a lease and returns
`remote_*` params naming them and its side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT). The decode
"reads" them with a real loopback POST to that side channel, which releases the lease; unknown
or expired blocks fail the decode like a failed NIXL transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.protocol import ApiError

PULL_PATH = "/xpyd/kv/pull"
_ID_SPACE = 1 << 31


@dataclass(slots=True)
class Lease:
    first_block: int
    blocks: int
    tokens: int
    expires: float


class LeaseTable:
    """Blocks held for decodes that have not pulled them yet; expired leases free their blocks."""

    def __init__(self, pool: BlockPool, engine_id: str, lease_seconds: float) -> None:
        self.pool = pool
        self.engine_id = engine_id
        self.lease_seconds = lease_seconds
        self._leases: dict[int, Lease] = {}
        self._next = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, blocks: int, tokens: int, now: float) -> list[int]:
        """Lease `blocks` already-pinned blocks; returns their ids."""
        first = self._next
        self._next = (self._next + blocks) % _ID_SPACE
        self._leases[first] = Lease(first, blocks, tokens, now + self.lease_seconds)
        return list(range(first, first + blocks))

    def release(self, engine_id: object, block_ids: object) -> Lease:
        """Hand the leased blocks to a decode; raises LookupError if they are unknown or expired."""
        if engine_id != self.engine_id:
            raise LookupError(f"engine {engine_id!r} is not this prefill engine ({self.engine_id})")
        if not isinstance(block_ids, list) or not block_ids or not isinstance(block_ids[0], int):
            raise LookupError("remote_block_ids must be a non-empty list of block ids")
        lease = self._leases.get(block_ids[0])
        if lease is None or lease.blocks != len(block_ids):
            raise LookupError(f"blocks {block_ids[0]}..{block_ids[-1]} are unknown or their lease expired")
        del self._leases[lease.first_block]
        self.pool.unpin(lease.blocks)
        return lease

    def expire(self, now: float) -> int:
        """Free every lease past its deadline; returns how many."""
        gone = [k for k, lease in self._leases.items() if lease.expires <= now]
        for key in gone:
            self.pool.unpin(self._leases.pop(key).blocks)
        self.expired += len(gone)
        return len(gone)


def side_channel_app(leases: LeaseTable) -> web.Application:
    """The side-channel HTTP app a decode pulls blocks from."""

    async def pull(request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            lease = leases.release(body.get("engine_id"), body.get("block_ids"))
        except (orjson.JSONDecodeError, AttributeError) as exc:
            return web.Response(status=400, body=ApiError(f"bad pull request: {exc}").body())
        except LookupError as exc:
            return web.Response(status=404, body=ApiError(str(exc), status=404).body())
        return web.json_response({"blocks": lease.blocks, "tokens": lease.tokens})

    app = web.Application()
    app.router.add_post(PULL_PATH, pull)
    return app


def remote_params(params: dict[str, Any]) -> tuple[str, list[int], str, int]:
    """Validate a decode's kv_transfer_params; raises ApiError(400) naming the bad field."""
    engine_id = params.get("remote_engine_id")
    block_ids = params.get("remote_block_ids")
    host = params.get("remote_host")
    port = params.get("remote_port")
    if not isinstance(engine_id, str):
        raise ApiError("kv_transfer_params.remote_engine_id must be a string.", param="kv_transfer_params")
    if not isinstance(block_ids, list) or not all(isinstance(b, int) for b in block_ids):
        raise ApiError("kv_transfer_params.remote_block_ids must be a list of ints.", param="kv_transfer_params")
    if not isinstance(host, str) or not isinstance(port, int):
        raise ApiError("kv_transfer_params.remote_host/remote_port are missing.", param="kv_transfer_params")
    return engine_id, block_ids, host, port


async def pull_blocks(session: aiohttp.ClientSession, params: dict[str, Any]) -> int:
    """Read a prefill's leased blocks over its side channel; returns the tokens they hold."""
    engine_id, block_ids, host, port = remote_params(params)
    url = f"http://{host}:{port}{PULL_PATH}"
    try:
        async with session.post(url, data=orjson.dumps({"engine_id": engine_id, "block_ids": block_ids})) as resp:
            body = await resp.read()
            if resp.status != 200:
                reason = orjson.loads(body).get("error", {}).get("message", body.decode(errors="replace"))
                raise ApiError(f"KV transfer from {engine_id} at {host}:{port} failed: {reason}", status=500)
            tokens: int = orjson.loads(body)["tokens"]
            return tokens
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ApiError(f"KV transfer from {engine_id} at {host}:{port} failed: {exc!r}", status=500) from None
