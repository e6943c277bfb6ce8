"""The emulator's KV events and /metrics as each engine release writes them: SGLang 0.5.23's map
events with `cache_salt`, vLLM's salt in extra_keys, SGLang's metric names behind --enable-metrics."""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
import pytest
from emu_harness import free_port, serving  # type: ignore[import-not-found]

from xpyd_api.engines import SGLANG_METRICS, VLLM_METRICS
from xpyd_emulator.cmdline import parse_engine_command
from xpyd_emulator.kv_publisher import KVEventBatch, to_wire
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.protocol import parse_request
from xpyd_emulator.worker import Worker

HOST = "127.0.0.1"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


# SGLang 0.5.23's schema (srt/disaggregation/kv_events.py), written here apart from the emulator's encoder:
# the batch positional, each event a map tagged by "type", None fields omitted.
class SEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class SBlockStored(SEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SBlockRemoved(SEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SAllBlocksCleared(SEvent, tag="AllBlocksCleared"):
    pass


class SBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[SBlockStored | SBlockRemoved | SAllBlocksCleared]
    attn_dp_rank: int | None = None


S_DECODE = msgspec.msgpack.Decoder(SBatch).decode
# vLLM 0.32's BlockStored map: the fields without a default are always there
_V: dict[str, Any] = {"type": "BlockStored", "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}
IDS = list(range(32))


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([("cleared",)], [SAllBlocksCleared()]),
        ([("removed", [7])], [SBlockRemoved([7], "GPU")]),
        ([("stored", [1, 2], 9, IDS)],  # one BlockStored per page, chained through parent_block_hash
         [SBlockStored([1], 9, IDS[:16], 16, None, "GPU"), SBlockStored([2], 1, IDS[16:], 16, None, "GPU")]),
        ([("stored", [1, 2], None, IDS, "tenant")],  # salted: every page says so
         [SBlockStored([1], None, IDS[:16], 16, None, "GPU", "tenant"),
          SBlockStored([2], 1, IDS[16:], 16, None, "GPU", "tenant")]),
    ],
)  # fmt: skip
def test_sglang_flavour_writes_0_5_23_map_events(events: list[Any], expected: list[Any]) -> None:
    payload = msgspec.msgpack.encode(KVEventBatch(1.0, to_wire(events, 16, True), 2))
    batch = S_DECODE(payload)
    assert (batch.events, batch.attn_dp_rank) == (expected, 2)
    raw = msgspec.msgpack.decode(payload)
    assert all(isinstance(e, dict) and "type" in e for e in raw[1])
    assert all("cache_salt" not in e for e in raw[1] if len(events[0]) < 5)  # None fields are left out


@pytest.mark.parametrize(
    ("event", "wire"),
    [
        (("stored", [1, 2], None, IDS, "tenant"),  # vLLM hashes the salt into a prompt's first block only
         {**_V, "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": IDS,
          "extra_keys": [["tenant"], None]}),
        (("stored", [3], 2, IDS[:16], "tenant"), {**_V, "block_hashes": [3], "parent_block_hash": 2,
                                                  "token_ids": IDS[:16]}),
        (("stored", [1], None, IDS[:16]), {**_V, "block_hashes": [1], "parent_block_hash": None,
                                           "token_ids": IDS[:16]}),
    ],
)  # fmt: skip
def test_vllm_flavour_puts_the_salt_in_extra_keys(event: tuple[Any, ...], wire: dict[str, Any]) -> None:
    payload = msgspec.msgpack.encode(KVEventBatch(1.0, to_wire([event], 16, False), 0))
    assert msgspec.msgpack.decode(payload)[1] == [wire]


def test_a_salted_prompt_has_its_own_blocks_and_says_so() -> None:
    def parse(body: dict[str, Any]) -> Any:
        raw = msgspec.json.encode({"prompt": "The quick brown fox. " * 10, "max_tokens": 1, **body})
        return parse_request(raw, chat=False, served=["m"], max_model_len=4096, block_size=16, hash_blocks=True,
                             default_output_tokens=16)  # fmt: skip

    plain, salted, other = parse({}), parse({"cache_salt": "a"}), parse({"cache_salt": "b"})
    assert len({plain.hashes[0], salted.hashes[0], other.hashes[0]}) == 3
    pool = BlockPool(64, 16)
    pool.events = []
    pool.salt(salted.hashes[0], "a")
    pool.insert(plain.hashes, plain.tokens)
    pool.insert(salted.hashes, salted.tokens)
    assert [len(e) for e in pool.take_events()] == [4, 5]  # the salted run carries its salt
    assert pool.match(salted.hashes) == len(salted.hashes) and pool.match(other.hashes) == 0


def _sglang(*flags: str) -> Worker:
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(free_port(HOST)), *flags]
    return Worker(parse_engine_command(cmd, {"XPYD_BIND_HOST": HOST}, zero_delay=True))


@pytest.mark.parametrize(
    ("flags", "status", "present", "absent"),
    [
        ((), 404, (), ()),  # SGLang serves /metrics only with --enable-metrics
        (("--enable-metrics",), 200, (SGLANG_METRICS.waiting, SGLANG_METRICS.running, SGLANG_METRICS.kv_usage[0],
                                      SGLANG_METRICS.cache_hit_rate, SGLANG_METRICS.ttft + "_count"),
         (VLLM_METRICS.waiting, VLLM_METRICS.prefix_queries, "vllm:cache_config_info")),
        # 0.5.3 exports the prompt-length histogram only with --collect-tokens-histogram (0.5.23 always)
        (("--enable-metrics", "--collect-tokens-histogram"), 200, (f"{SGLANG_METRICS.prompt_length}_bucket",),
         (f"{VLLM_METRICS.prompt_length}_bucket",)),
    ],
)  # fmt: skip
async def test_sglang_metrics_only_with_enable_metrics_and_by_sglang_names(
    flags: tuple[str, ...], status: int, present: tuple[str, ...], absent: tuple[str, ...]
) -> None:
    async with serving(_sglang(*flags)) as base, aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        text = await resp.text()
        assert resp.status == status
    names = {line.split("{", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert set(present) <= names
    assert not set(absent) & names
