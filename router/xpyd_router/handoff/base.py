"""The seam between the router's hops and an engine's KV handoff: what a protocol module gets and gives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from xpyd_http.messages import Answer, Reply
from xpyd_router.http.protocol import JsonObj

__all__ = ["Handoff", "HopFailed", "JsonObj", "Legs"]


class HopFailed(Exception):
    """A worker failed before the client saw any of its answer: the request may go to another worker.

    The message is for the client (no addresses); `detail` names the worker, for the log.
    """

    def __init__(self, message: str, detail: str, worker: str, worker_down: bool) -> None:
        super().__init__(message)
        self.detail = detail
        self.worker = worker
        self.worker_down = worker_down


class Legs(Protocol):
    """The two legs of one disaggregated request, as the hops run them (accounting, timeouts, relay)."""

    async def prefill(self, worker: str, payload: bytes, parse: Callable[[bytes], Any]) -> Any | Reply:
        """`parse` of the prefill worker's 2xx body, or the client-error reply to pass back; HopFailed
        otherwise (a body `parse` refuses with BadReply included)."""
        ...

    async def decode(self, worker: str, payload: bytes) -> Answer:
        """The decode worker's answer, streamed to the client or whole; HopFailed before its first byte."""
        ...

    def blame(self, failed: HopFailed) -> None:
        """Counts a failure that did not fail the request (a leg that ran beside the answering one)."""
        ...


class Handoff(ABC):
    """One engine protocol for moving a prompt's KV from a prefill worker to a decode worker."""

    name: str

    @abstractmethod
    async def run(self, legs: Legs, body: JsonObj, prefill: str, decode: str) -> Answer:
        """Serves the request `body` over `prefill` then (or beside it) `decode`."""
