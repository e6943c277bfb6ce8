"""Salted KV blocks (a request's cache_salt): decoded from every engine layout and keyed apart, so a
salted block never matches an unsalted prompt or another salt's."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from xpyd_emulator.kv_publisher import KVEventBatch, to_wire
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.tokens import block_hashes_text, salted_seed, token_ids
from xpyd_router.kv.block_keys import RequestKeys, salt_root
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import Stored, decode_batch
from xpyd_router.tokens.engine import EmulatorTokenizer

KEYS = RequestKeys(EmulatorTokenizer(), 16, 256, 4.0)
IDS = list(range(32))
TEXT = "You are a helpful assistant. Answer briefly. " * 12  # 8 full blocks


def _pack(*events: Any) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), 0])


def _sglang(**fields: Any) -> dict[str, Any]:
    """SGLang 0.5.23's BlockStored: a map, None fields omitted, cache_salt and session_id top-level."""
    return {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": IDS,
            "block_size": 16, "lora_id": None, "medium": "GPU", **fields}  # fmt: skip


def _vllm(**fields: Any) -> dict[str, Any]:
    """vLLM 0.33's BlockStored map (lora_name, extra_keys per block, group and spec, locality, ...)."""
    return {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": IDS,
            "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": None,
            "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": None, "ownership": None,
            "session_id": None, "lookahead_token_ids": None, **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "events"),
    [
        (_pack(_sglang()), [Stored([1, 2], None, IDS, 16)]),  # SGLang 0.5.23 without a salt
        (_pack(_sglang(cache_salt="t")), [Stored([1, 2], None, IDS, 16, "t")]),
        (_pack(_sglang(cache_salt="t", session_id="s1")), [Stored([1, 2], None, IDS, 16, "t")]),
        (_pack(_sglang(lora_name="adapter")), []),
        (_pack(_vllm()), [Stored([1, 2], None, IDS, 16)]),
        (_pack(_vllm(extra_keys=[["t"], None])), [Stored([1, 2], None, IDS, 16, "t")]),  # vLLM's salt
        (_pack(_vllm(extra_keys=[["t", ["mm", 0]], None])), []),  # salt and media: not keyable
        (_pack(_vllm(extra_keys=[None, [["mm", 0]]])), []),
        (_pack(_vllm(parent_block_hash=7, extra_keys=[["x"], None])), []),  # not a prompt's first block
        (_pack(["BlockStored", [1, 2], None, IDS, 16, None, "GPU", None, [["t"], None]]),  # vLLM 0.2x positional
         [Stored([1, 2], None, IDS, 16, "t")]),
        (_pack(["BlockStored", [1, 2], None, IDS, 16, None, "GPU", None, [None, ["mm", 0]]]), []),
    ],
)  # fmt: skip
def test_salted_blocks_are_decoded_with_their_salt(payload: bytes, events: list[Any]) -> None:
    assert decode_batch(payload) == events


def _engine_events(text: str, salt: str | None, per_page: bool) -> bytes:
    """One prompt's events from the emulator's pool, in its SGLang (0.5.23) or vLLM layout."""
    pool = BlockPool(64, 16)
    pool.events = []
    ids = token_ids(text)
    hashes = block_hashes_text(text, 16) if salt is None else _salted(ids, salt)
    if salt is not None:
        pool.salt(hashes[0], salt)
    pool.insert(hashes, ids)
    return msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(pool.take_events(), 16, per_page), 0))


def _salted(ids: Any, salt: str) -> list[int]:
    from xpyd_emulator.tokens import chain_hashes

    return chain_hashes(ids, 16, seed=salted_seed(salt))


@pytest.mark.parametrize("per_page", [True, False], ids=["sglang-0.5.23", "vllm"])
@pytest.mark.parametrize(
    ("stored_salt", "asked_salt", "matched"),
    [
        ("tenant-a", None, 0),  # a salted block never matches an unsalted prompt
        ("tenant-a", "tenant-b", 0),  # nor another salt's
        ("tenant-a", "tenant-a", 8),  # its own salt's prompt finds all of it
        (None, "tenant-a", 0),
        (None, None, 8),
    ],
)
def test_salted_blocks_match_only_prompts_of_their_salt(
    per_page: bool, stored_salt: str | None, asked_salt: str | None, matched: int
) -> None:
    index = PrefixIndex()
    EngineView("w", index, 16).apply(decode_batch(_engine_events(TEXT, stored_salt, per_page)))
    body: dict[str, Any] = {"prompt": TEXT} | ({"cache_salt": asked_salt} if asked_salt else {})
    keys = KEYS.for_request(body, TEXT, chat=False)
    assert index.match(keys).get("w", 0) == matched


@pytest.mark.parametrize(("salt", "root"), [(None, 0), ("", 0), (5, 0)])
def test_no_salt_is_the_plain_chain(salt: object, root: int) -> None:
    assert salt_root(salt) == root
    assert salt_root("a") != salt_root("b") and salt_root("a") % 2 == 1
