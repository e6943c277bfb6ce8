"""A headless member's KV-event sockets: it serves its own ranks' events, which the leader produces.

In vLLM each data-parallel rank's scheduler publishes from the pod that hosts it, so a subscriber
reads rank r at tcp://POD_OF_r:port+r (distributed/kv_events.py offset_endpoint_port). The
emulator runs every rank's engine on the leader, which publishes rank r on its own host at
port+r; a member hosting ranks [start, start+L) relays them so its own address answers too:

- events: an XSUB socket connected to the leader's PUB at leader:port+r feeds an XPUB bound at
  member:port+r (zmq's XSUB/XPUB proxy: subscriptions flow up, batches flow down unchanged, so
  topic, sequence numbers and data_parallel_rank are the leader's, i.e. rank r's);
- replay: a ROUTER bound at member:replay+r takes a client's [identity, "", start_seq]; the relay
  asks the leader's replay ROUTER at leader:replay+r over a DEALER of its own per client (a
  plain ROUTER->DEALER proxy would add a routing frame that vLLM's replay server, expecting
  exactly three frames, refuses) and hands every reply frame back to that client until the
  end marker (seq -1) or REPLAY_SILENCE seconds without an answer.

One thread polls every socket (POLL_MS at a time, so `close` stops it promptly) and owns them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import zmq

from xpyd_emulator.kv_events import KvEventsConfig
from xpyd_emulator.kv_publisher import END_SEQ

log = logging.getLogger("xpyd.emulator")
POLL_MS = 50
REPLAY_SILENCE = 10.0  # seconds a replay waits for the leader's next frame
MAX_REPLAYS = 64  # replays in flight per relay; more are answered with the end marker at once


def relayed(endpoint: str) -> bool:
    """Whether a member relays this endpoint: a tcp address vLLM would bind (wildcard host)."""
    return endpoint.startswith("tcp://") and KvEventsConfig.binds(endpoint)


def upstream(endpoint: str, leader: str) -> str:
    """The leader's address for a wildcard endpoint: its port on the leader's host."""
    port = endpoint.rpartition(":")[2]
    return f"tcp://{leader}:{port}"


@dataclass(slots=True)
class _Link:
    rank: int
    xsub: zmq.Socket[bytes]
    xpub: zmq.Socket[bytes]
    router: zmq.Socket[bytes] | None
    replay_upstream: str | None


@dataclass(slots=True)
class _Replay:
    link: _Link
    client: bytes
    deadline: float


class KvEventRelay:
    """Serves ranks `ranks`' KV events and replay on `host`, read from the leader at `leader`."""

    def __init__(self, config: KvEventsConfig, ranks: range, leader: str, host: str) -> None:
        self._ctx = zmq.Context()
        self._links: list[_Link] = []
        self._sockets: list[zmq.Socket[bytes]] = []
        try:
            for rank in ranks:
                self._links.append(self._link(config.for_rank(rank), rank, leader, host))
        except (zmq.ZMQError, ValueError) as exc:
            self._close()
            reason = exc.strerror if isinstance(exc, zmq.ZMQError) else str(exc)
            raise OSError(getattr(exc, "errno", None), f"KV events relay: {reason}") from None
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events-relay", daemon=True)
        self._thread.start()

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self._sockets.append(sock)
        return sock

    def _link(self, config: KvEventsConfig, rank: int, leader: str, host: str) -> _Link:
        xsub, xpub = self._socket(zmq.XSUB), self._socket(zmq.XPUB)
        xpub.set_hwm(config.hwm)
        xsub.set_hwm(config.hwm)
        xsub.connect(upstream(config.endpoint, leader))
        xpub.bind(config.bind_address(config.endpoint, host))
        router, replay_upstream = None, None
        if config.replay_endpoint is not None and relayed(config.replay_endpoint):
            router = self._socket(zmq.ROUTER)
            router.bind(config.bind_address(config.replay_endpoint, host))
            replay_upstream = upstream(config.replay_endpoint, leader)
        return _Link(rank, xsub, xpub, router, replay_upstream)

    def _loop(self) -> None:
        poller = zmq.Poller()
        for link in self._links:
            for sock in (link.xsub, link.xpub, link.router):
                if sock is not None:
                    poller.register(sock, zmq.POLLIN)
        replays: dict[zmq.Socket[bytes], _Replay] = {}
        try:
            while self._running:
                ready = dict(poller.poll(POLL_MS))
                for link in self._links:
                    if link.xsub in ready:  # a batch from the leader
                        link.xpub.send_multipart(link.xsub.recv_multipart())
                    if link.xpub in ready:  # a subscriber's (un)subscription
                        link.xsub.send_multipart(link.xpub.recv_multipart())
                    if link.router is not None and link.router in ready:
                        self._ask(link, poller, replays)
                now = time.monotonic()
                for dealer, replay in list(replays.items()):
                    if dealer in ready:
                        frames = dealer.recv_multipart()
                        assert replay.link.router is not None
                        replay.link.router.send_multipart([replay.client, *frames])
                        replay.deadline = now + REPLAY_SILENCE
                        if len(frames) >= 2 and frames[1] == END_SEQ:
                            self._drop(dealer, poller, replays)
                    elif replay.deadline < now:
                        log.warning("KV replay of rank %d: the leader did not answer; gave up", replay.link.rank)
                        self._drop(dealer, poller, replays)
        except Exception:  # a bug or a closed socket: say so; the member keeps its place in the group
            log.exception("KV events relay stopped")
        finally:
            for dealer in list(replays):
                self._drop(dealer, poller, replays)
            self._close()

    def _ask(self, link: _Link, poller: zmq.Poller, replays: dict[zmq.Socket[bytes], _Replay]) -> None:
        """Forward one client's replay request to the leader on a DEALER of its own."""
        assert link.router is not None and link.replay_upstream is not None
        frames = link.router.recv_multipart()
        if len(frames) != 3:
            log.warning("ignored a KV replay request of %d frames", len(frames))
            return
        client, _, start = frames
        if len(replays) >= MAX_REPLAYS:
            link.router.send_multipart((client, b"", END_SEQ, b""))
            return
        dealer = self._socket(zmq.DEALER)
        dealer.connect(link.replay_upstream)
        dealer.send_multipart((b"", start))
        poller.register(dealer, zmq.POLLIN)
        replays[dealer] = _Replay(link, client, time.monotonic() + REPLAY_SILENCE)

    def _drop(self, dealer: zmq.Socket[bytes], poller: zmq.Poller, replays: dict[zmq.Socket[bytes], _Replay]) -> None:
        poller.unregister(dealer)
        replays.pop(dealer, None)
        self._sockets.remove(dealer)
        dealer.close(linger=0)

    def close(self, timeout: float = 2.0) -> None:
        """Stop relaying: the thread closes every socket and the context."""
        self._running = False
        self._thread.join(timeout)

    def _close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets = []
        self._ctx.term()
