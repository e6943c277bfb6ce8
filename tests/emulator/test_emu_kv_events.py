"""The emulator's KV events: vLLM's wire format byte for byte, replay, evictions and the config flag."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec
import numpy as np
import pytest
import zmq
from emu_harness import free_port, make_config, running  # type: ignore[import-not-found]

from xpyd_emulator.errors import CommandLineError
from xpyd_emulator.kv_events import KvEventsConfig, parse_kv_events
from xpyd_emulator.kv_publisher import KVEventBatch, ZmqPublisher, to_wire
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.tokens import block_hashes_text, token_ids

HOST = "127.0.0.1"


# vLLM 0.32's schema, as vllm/distributed/kv_events.py declares it (events are tagged maps from 0.32, arrays
# before): written here independently of the emulator's encoder, which the tests must not trust (and
# tests/contract decodes the emulator's bytes with the release's own Structs).
class VEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(VKVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None


class BlockRemoved(VKVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(VKVCacheEvent):
    pass


class VKVEventBatch(VEventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(type=VKVEventBatch).decode


def _publisher(per_page: bool = False, buffer_steps: int = 100) -> tuple[ZmqPublisher, str, str]:
    events, replay = free_port(HOST), free_port(HOST)
    config = KvEventsConfig(f"tcp://*:{events}", f"tcp://*:{replay}", buffer_steps=buffer_steps, topic="kv-events")
    return ZmqPublisher(config, HOST, 16, per_page), f"tcp://{HOST}:{events}", f"tcp://{HOST}:{replay}"


def _sub(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.connect(endpoint)
    time.sleep(0.2)  # ZMQ's slow joiner: PUB drops what it sends before the subscription arrives
    return sub


def _recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    assert sock.poll(3000), "nothing published"
    return sock.recv_multipart()


def test_pool_events_on_the_wire_are_vllm_bytes() -> None:
    pool = BlockPool(num_blocks=4, block_size=16)
    pool.events = []
    text = "The quick brown fox jumps over the lazy dog. " * 8  # 360 chars: 90 tokens, 5 full blocks
    ids, hashes = token_ids(text), block_hashes_text(text, 16)
    pool.insert(hashes[:2], ids)
    pool.insert(hashes, ids)  # 2 cached: stores blocks 2-4 after parent 1, then evicts down to 4 blocks
    pub, endpoint, _ = _publisher()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sub = _sub(ctx, endpoint)
        pub.publish(pool.take_events())
        topic, seq, payload = _recv(sub)
        sub.close(linger=0)
    finally:
        pub.shutdown()
        ctx.term()
    assert (topic, seq) == (b"kv-events", (0).to_bytes(8, "big"))
    batch = DECODE(payload)
    assert batch.data_parallel_rank == 0
    first, second, *removed = batch.events
    assert first == BlockStored(hashes[:2], None, ids[:32].tolist(), 16, None, "GPU", None)
    assert second == BlockStored(hashes[2:], hashes[1], ids[32:80].tolist(), 16, None, "GPU", None)
    # The LRU end holds the prompt's tail (vLLM frees a request's blocks in reverse): block 4 goes, one event.
    assert removed == [BlockRemoved([hashes[4]], "GPU")]
    raw = msgspec.msgpack.decode(payload)  # and the layout itself: the batch an array, each event a map
    assert raw[1][1] == {"type": "BlockStored", "block_hashes": hashes[2:], "parent_block_hash": hashes[1],
                         "token_ids": ids[32:80].tolist(), "block_size": 16, "lora_id": None, "medium": "GPU",
                         "lora_name": None}  # fmt: skip
    assert raw[1][2] == {"type": "BlockRemoved", "block_hashes": [hashes[4]], "medium": "GPU"}


@pytest.mark.parametrize(
    ("events", "per_page", "expected"),
    [
        ([("cleared",)], False, [AllBlocksCleared()]),
        ([("removed", [7])], False, [BlockRemoved([7], "GPU")]),
        ([("stored", [1, 2], None, list(range(32)))], False,
         [BlockStored([1, 2], None, list(range(32)), 16, None, "GPU", None)]),
    ],  # SGLang's layout: test_emu_engine_wire.py
)  # fmt: skip
def test_each_event_kind_encodes_as_the_engines_do(events: list[Any], per_page: bool, expected: list[Any]) -> None:
    payload = msgspec.msgpack.encode(KVEventBatch(1.0, to_wire(events, 16, per_page), 0))
    assert DECODE(payload).events == expected


def test_replay_answers_from_a_start_seq_then_the_end_marker() -> None:
    pub, endpoint, replay_endpoint = _publisher(buffer_steps=3)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sub = _sub(ctx, endpoint)
        for i in range(5):
            pub.publish([("removed", [i])])
        seqs = [int.from_bytes(_recv(sub)[1], "big") for _ in range(5)]
        dealer = ctx.socket(zmq.DEALER)  # the ROUTER side expects [identity, "", start_seq]
        dealer.connect(replay_endpoint)
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while True:
            empty, seq, payload = _recv(dealer)
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                break
            replayed.append((int.from_bytes(seq, "big"), DECODE(payload).events))
        dealer.close(linger=0)
        sub.close(linger=0)
    finally:
        pub.shutdown()
        ctx.term()
    assert seqs == [0, 1, 2, 3, 4]
    assert replayed == [(i, [BlockRemoved([i], "GPU")]) for i in (2, 3, 4)]  # the buffer kept the last 3


@pytest.mark.parametrize(
    ("engine", "text", "result"),
    [
        ("vllm", '{"enable_kv_cache_events":true}', KvEventsConfig()),
        ("vllm", '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","topic":"t"}',
         KvEventsConfig("tcp://*:6000", topic="t")),
        ("vllm", '{"enable_kv_cache_events":false,"publisher":"zmq"}', None),
        ("vllm", '{"enable_kv_cache_events":true,"publisher":"null"}', None),
        ("vllm", '{"enable_kv_cache_events":true,"endpont":"tcp://*:1"}', "unknown keys"),
        ("vllm", '{"enable_kv_cache_events":true,"publisher":"kafka"}', "not \\\"null\\\" or \\\"zmq\\\""),
        ("vllm", '{"enable_kv_cache_events":true,"buffer_steps":"10"}', "wrong type"),
        ("vllm", '{"enable_kv_cache_events":true,"endpoint":"http://x:1"}', "tcp://HOST:PORT"),
        ("vllm", "[1]", "JSON object"),
        ("vllm", "{", "not JSON"),
        ("sglang", '{"publisher":"zmq","topic":"t","enable_kv_cache_events":true,"whatever":1}',
         KvEventsConfig(topic="t")),
        ("sglang", '{"topic":"t"}', None),
    ],
)  # fmt: skip
def test_kv_events_config_reads_as_the_engine_reads_it(engine: str, text: str, result: object) -> None:
    if isinstance(result, str):
        with pytest.raises(CommandLineError, match=result):
            parse_kv_events(text, engine)
    else:
        assert parse_kv_events(text, engine) == result


async def test_a_served_request_publishes_its_prompt_blocks_and_a_reset_clears() -> None:
    port = free_port(HOST)
    config = f'{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{port}","topic":"kv-events"}}'
    cfg = make_config(HOST, "meta-llama/Llama-3.1-8B-Instruct", "--kv-events-config", config, zero_delay=True)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    prompt = "a prompt of a few blocks " * 20  # 500 chars: 125 tokens, 7 full blocks of 16
    try:
        async with running(cfg) as base, aiohttp.ClientSession() as session:
            sub = await asyncio.to_thread(_sub, ctx, f"tcp://{HOST}:{port}")
            async with session.post(base + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as resp:
                assert resp.status == 200
            stored = DECODE((await asyncio.to_thread(_recv, sub))[2]).events
            async with session.post(base + "/reset_prefix_cache") as resp:
                assert resp.status == 200
            cleared = DECODE((await asyncio.to_thread(_recv, sub))[2]).events
            sub.close(linger=0)
    finally:
        ctx.term()
    blocks = block_hashes_text(prompt, 16)
    assert stored == [BlockStored(blocks, None, token_ids(prompt)[:112].tolist(), 16, None, "GPU", None)]
    assert cleared == [AllBlocksCleared()]


def test_token_ids_are_four_characters_each_and_stable() -> None:
    ids = token_ids("abcdabcdé")
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
    assert np.array_equal(token_ids("abcd" * 40)[:16], token_ids("abcd" * 16))
    assert all(0 <= t < 1 << 17 for t in token_ids("\U0001f600 emoji and \ud800 a lone surrogate"))
