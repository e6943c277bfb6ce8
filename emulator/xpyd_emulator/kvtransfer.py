"""The NixlConnector stand-in: leases on prefilled blocks, the side channel, and the decode's pull.

A prefill with `do_remote_decode` that finishes keeps its prompt's blocks pinned under a lease
(streamed or not, as vLLM's request_finished does) and returns `remote_*` params naming them and
its side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT). The decode "reads" them with a real POST to
that side channel, which releases the lease; a lease nobody pulls expires after
XPYD_KV_LEASE_SECONDS (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT), so blocks are never pinned for
good. The side channel serves allowed peers only; unknown or expired blocks fail the decode like
a failed NIXL transfer. Its answer carries the prefill's handshake (its handoff facts and engine
revision, as NIXL's handshake carries vLLM's compatibility hash), which the decode checks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from xpyd_emulator.errors import ApiError, error_body
from xpyd_emulator.listener import Limits, make_server
from xpyd_emulator.peers import MAX_BLOCK_ID, PeerPolicy, RemoteKv, url_host
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_http.messages import Reply, Request
from xpyd_http.server import Server

PULL_PATH = "/xpyd/kv/pull"
_ID_SPACE = 1 << 31
SIDE_CHANNEL_MAX_BODY = 1 << 20


@dataclass(slots=True)
class Lease:
    first_block: int
    blocks: int
    tokens: int
    expires: float
    rank: int = 0  # the data-parallel rank whose blocks it holds


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

    def grant(self, blocks: int, tokens: int, now: float, rank: int = 0) -> list[int]:
        """Lease `blocks` blocks already pinned on `rank`; returns their ids."""
        first = self._next if self._next + blocks <= _ID_SPACE else 0
        self._next = first + blocks
        self._leases[first] = Lease(first, blocks, tokens, now + self.lease_seconds, rank)
        return list(range(first, first + blocks))

    def release(self, engine_id: object, block_ids: object) -> Lease:
        """Hand the leased blocks to a decode; raises LookupError if they are unknown or expired."""
        if engine_id != self.engine_id:
            raise LookupError(f"engine {str(engine_id)[:80]!r} is not this prefill engine ({self.engine_id})")
        if not isinstance(block_ids, list) or not block_ids or type(block_ids[0]) is not int:
            raise LookupError("remote_block_ids must be a non-empty list of block ids")
        lease = self._leases.get(block_ids[0])
        if lease is None or lease.blocks != len(block_ids):
            raise LookupError(f"blocks {block_ids[0]}..{block_ids[-1]} are unknown or their lease expired")
        self.drop(lease.first_block)
        return lease

    def drop(self, first_block: int) -> Lease | None:
        """Free a lease at once (its prefill's client went away before reading the block ids)."""
        lease = self._leases.pop(first_block, None)
        if lease is not None:
            self.pool.unpin(lease.blocks, lease.rank)
        return lease

    def expire(self, now: float) -> int:
        """Free every lease past its deadline; returns how many."""
        gone = [k for k, lease in self._leases.items() if lease.expires <= now]
        for key in gone:
            self.drop(key)
        self.expired += len(gone)
        return len(gone)


def _reply(status: int, message: str) -> Reply:
    return Reply(status, error_body(message, status))


def side_channel_server(
    leases: LeaseTable, peers: PeerPolicy, limits: Limits, handshake: dict[str, Any] | None = None
) -> Server:
    """The side channel a decode pulls blocks from (allowed peers only); `handshake` rides on each answer."""
    body_timeout = limits.body_timeout

    async def pull(request: Request) -> Reply:
        remote = request.remote or ""
        if not peers.allows(remote):
            return _reply(403, f"{remote} is not a KV peer of this worker")
        try:
            async with asyncio.timeout(body_timeout):
                body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _reply(400, f"bad pull request: {exc}")
        except TimeoutError:
            return _reply(408, f"pull request body not received within {body_timeout:g} s")
        ids = body.get("block_ids") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("engine_id"), str)
            or not isinstance(ids, list)
            or not all(type(b) is int and 0 <= b <= MAX_BLOCK_ID for b in ids)
        ):
            return _reply(400, "bad pull request: expected {engine_id: string, block_ids: [int, ...]}")
        try:
            lease = leases.release(body["engine_id"], ids)
        except LookupError as exc:
            return _reply(404, str(exc))
        return Reply(200, orjson.dumps({"blocks": lease.blocks, "tokens": lease.tokens, "handshake": handshake or {}}))

    return make_server({("POST", PULL_PATH): pull}, limits, max_body=SIDE_CHANNEL_MAX_BODY)


async def pull_blocks(session: aiohttp.ClientSession, remote: RemoteKv) -> tuple[int, dict[str, Any]]:
    """Read a prefill's leased blocks over its side channel; returns the tokens they hold and its handshake."""
    where = f"{remote.engine_id} at {remote.host}:{remote.port}"
    url = f"http://{url_host(remote.host)}:{remote.port}{PULL_PATH}"
    payload = orjson.dumps({"engine_id": remote.engine_id, "block_ids": remote.block_ids})
    try:
        async with session.post(url, data=payload) as resp:
            doc = orjson.loads(await resp.read())
            if resp.status != 200:
                error = doc.get("error") if isinstance(doc, dict) else None
                reason = error.get("message") if isinstance(error, dict) else None
                raise ApiError(f"KV transfer from {where} failed: {reason or resp.status}", status=500)
            tokens = doc.get("tokens") if isinstance(doc, dict) else None
            if type(tokens) is not int:
                raise ApiError(f"KV transfer from {where} failed: malformed side-channel reply", status=500)
            handshake = doc.get("handshake")
            return tokens, handshake if isinstance(handshake, dict) else {}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ApiError(f"KV transfer from {where} failed: {exc!r}", status=500) from None
