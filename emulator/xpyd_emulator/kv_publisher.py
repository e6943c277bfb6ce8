"""The engine's KV-event publisher: the newest vLLM's ZMQ wire format, byte for byte, fed by the block pool.

Wire (vLLM 0.32 on `vllm/distributed/kv_events.py`, SGLang 0.5.23 `srt/disaggregation/kv_events.py`; both
checked against the releases' own structs by tests/contract): a PUB socket sends one multipart message per
engine step, [topic, seq, payload], seq an 8-byte big-endian counter from 0, payload a msgpack batch encoded
by msgspec: [ts, [event, ...], data_parallel_rank] (an array), each event a map tagged by "type" with
defaulted fields left out: {"type": "BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name}, {"type": "BlockRemoved", block_hashes, medium} or {"type": "AllBlocksCleared"}
(vLLM before 0.32 sent each event as a tagged array; the router reads both). A ROUTER replay socket answers
[identity, "", start_seq] with [identity, "", seq, payload] for each buffered batch from start_seq on, then
[identity, "", -1 (8 bytes, signed), ""]. vLLM sends one BlockStored per newly cached run of a request
(hashes chained through parent_block_hash) and one BlockRemoved per evicted block; SGLang one BlockStored
per page. With a CPU tier (vLLM's native offloading) the OffloadingConnector's events join the
step's batch as vLLM publishes them: {"type": "BlockStored", block_hashes (the GPU's hashes), parent
None, token_ids [], block_size, lora_id None, medium "CPU", lora_name None} for blocks copied to
host memory and {"type": "BlockRemoved", block_hashes, medium "CPU"} for those the tier drops; the
GPU's own events keep medium "GPU". Like vLLM, a thread encodes and sends. A salted prompt's first
run carries its salt as vLLM publishes it: extra_keys, the first block's [salt].

The SGLang flavour publishes SGLang 0.5.23's layout: the batch still [ts, events, attn_dp_rank],
each event a map tagged by "type" with None fields left out, BlockStored carrying `cache_salt`.

A data-parallel rank r publishes on its own sockets, the endpoints' ports + r (KvEventsConfig
.for_rank), every batch carrying data_parallel_rank r and its own sequence numbers from 0, as
each vLLM scheduler creates its own ZmqEventPublisher with its global rank.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from itertools import count
from typing import Any

import msgspec
import zmq

from xpyd_emulator.kv_events import KvEventsConfig
from xpyd_emulator.prefix_cache import KvEvent

log = logging.getLogger("xpyd.emulator")
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # vLLM's CPU offloading medium (kv_offload/cpu spec's medium())
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None  # SGLang names it attn_dp_rank; same position


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of vLLM's events (0.32 on): maps tagged by "type" (the class name), defaulted fields left out."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None  # required (no default): always on the wire, None without LoRA
    extra_keys: list[list[str] | None] | None = None  # a salted prompt's first block: [salt]; one per block


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """SGLang 0.5.23's events: tagged maps (`type`), None fields omitted."""


class MapBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None


class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class MapAllBlocksCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class KVEventBatch(EventBatch):
    events: list[Any]


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared | MapEvent


def to_wire(events: list[KvEvent], block_size: int, per_page: bool) -> list[WireEvent]:
    """The block pool's events as the engine's structs (per_page: SGLang's, one BlockStored per page)."""
    out: list[WireEvent] = []
    for event in events:
        kind = event[0]
        if kind == "removed":
            out.append(
                MapBlockRemoved(list(event[1]), MEDIUM_GPU) if per_page else BlockRemoved(list(event[1]), MEDIUM_GPU)
            )
        elif kind == "unloaded":
            hashes = list(event[1])
            out.append(MapBlockRemoved(hashes, MEDIUM_CPU) if per_page else BlockRemoved(hashes, MEDIUM_CPU))
        elif kind == "offloaded":
            hashes = list(event[1])
            out.append(
                MapBlockStored(hashes, None, [], block_size, None, MEDIUM_CPU)
                if per_page
                else BlockStored(hashes, None, [], block_size, None, MEDIUM_CPU, None)
            )
        elif kind == "cleared":
            out.append(MapAllBlocksCleared() if per_page else AllBlocksCleared())
        else:
            _, hashes, parent, ids, *rest = event
            salt: str | None = rest[0] if rest else None
            tokens: list[int] = ids.tolist() if hasattr(ids, "tolist") else list(ids)
            if not per_page:
                out.append(_vllm_stored(list(hashes), parent, tokens, block_size, salt))
                continue
            for i, h in enumerate(hashes):
                page = tokens[i * block_size : (i + 1) * block_size]
                out.append(MapBlockStored([h], parent, page, block_size, None, MEDIUM_GPU, salt))
                parent = h
    return out


def _vllm_stored(hashes: list[int], parent: int | None, tokens: list[int], size: int, salt: str | None) -> WireEvent:
    if salt is None or parent is not None:  # the salt is hashed into a prompt's first block only
        return BlockStored(hashes, parent, tokens, size, None, MEDIUM_GPU, None)
    extra: list[list[str] | None] = [[salt], *([None] * (len(hashes) - 1))]
    return BlockStored(hashes, parent, tokens, size, None, MEDIUM_GPU, None, extra)


class ZmqPublisher:
    """PUB + ROUTER sockets with a replay buffer of the last `buffer_steps` batches."""

    def __init__(
        self, config: KvEventsConfig, host: str, block_size: int, per_page: bool = False, rank: int = 0
    ) -> None:
        self.block_size, self.per_page, self.rank = block_size, per_page, rank
        try:
            config = config.for_rank(rank)
        except ValueError as exc:
            raise OSError(f"KV events endpoint: {exc}") from None
        self.dropped = 0
        self._queue: queue.Queue[tuple[float, list[KvEvent]] | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._seq = count()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            address = config.bind_address(config.endpoint, host)
            if config.binds(config.endpoint):
                self._pub.bind(address)
            else:
                self._pub.connect(address)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.bind_address(config.replay_endpoint, host))
        except zmq.ZMQError as exc:
            self._close()
            raise OSError(exc.errno, f"KV events endpoint: {exc.strerror}") from None
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KvEvent]) -> None:
        """Queue one step's events; never blocks the engine (a full queue drops the batch, counted)."""
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        encode = msgspec.msgpack.Encoder().encode
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                break
            ts, events = item
            try:
                payload = encode(KVEventBatch(ts, to_wire(events, self.block_size, self.per_page), self.rank))
                seq = next(self._seq)
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
            except Exception:  # a bug or a closed socket: say so, keep the engine serving
                log.exception("KV event batch not published")

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("ignored a KV replay request of %d frames", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (for up to `timeout` seconds), then close the sockets."""
        self._running = False
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._close()

    def _close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
