"""Engine KV-event payloads decoded into the three facts the router uses: stored, removed, cleared.

vLLM and SGLang send a msgpack batch [ts, events, dp_rank] (vLLM < the map encoding of
vllm-project/vllm#42892 and SGLang: every event a tagged array; after it each event is a map
with a "type" key). Stored: block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, then fields later releases appended (lora_name, extra_keys, group_idx, ...; SGLang may
put a metadata map 8th). Hashes are 64-bit ints, or bytes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
Blocks the router's keys cannot stand for are dropped: LoRA or salted blocks, other media (CPU
offload tiers), other KV-cache groups (hybrid models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx")  # fmt: skip
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_GPU = (None, "GPU")


class WireError(ValueError):
    """A payload that is not an engine KV-event batch."""


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: list[int]
    parent: int | None
    tokens: list[int]
    block_size: int


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: list[int]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


KvEvent = Stored | Removed | Cleared
_decode = msgspec.msgpack.Decoder().decode


def block_hash(raw: Any) -> int:
    """An engine block hash as an int (bytes: their last 8, big-endian, as llm-d reads them)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, bytes) and raw:
        return int.from_bytes(raw[-8:], "big")
    raise WireError(f"block hash {raw!r} is neither an int nor bytes")


def _fields(event: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(event, list) and event and isinstance(event[0], str):
        values = dict(zip(names, event[1:], strict=False))
        if len(event) > 7 and isinstance(event[7], dict):  # SGLang's metadata map, not a LoRA name
            values["lora_name"], values["metadata"] = None, event[7]
        return event[0], values
    if isinstance(event, dict) and isinstance(event.get("type"), str):
        return event["type"], event
    raise WireError(f"not a tagged KV event: {str(event)[:80]}")


def _usable(f: dict[str, Any]) -> bool:
    """Blocks of the base model, on the GPU, in the first KV-cache group, without salt or extra keys."""
    extra = f.get("extra_keys") or ()
    salted = bool((f.get("metadata") or {}).get("cache_salt"))
    return (f.get("medium") in _GPU and f.get("group_idx") in (None, 0) and f.get("lora_id") is None
            and f.get("lora_name") is None and not salted and all(k is None for k in extra))  # fmt: skip


class _Event(msgspec.Struct, array_like=True, tag=True, gc=False):
    """The positional schema (vLLM before the map encoding, SGLang), decoded in C: the fast path."""


class _Stored(_Event, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    dp_rank: int | None = None


_decode_positional = msgspec.msgpack.Decoder(_Batch).decode


def decode_batch(payload: bytes) -> list[KvEvent]:
    """The usable events of one batch, in order (runs of removals merged); raises WireError on a payload
    of another shape."""
    try:
        typed = _decode_positional(payload).events
    except (msgspec.ValidationError, msgspec.DecodeError):  # maps, SGLang metadata, a newer field: the slow path
        return _decode_any(payload)
    out: list[KvEvent] = []
    for e in typed:
        if type(e) is _Removed:
            if e.medium in _GPU and e.group_idx in (None, 0):
                hashes = _ints(e.block_hashes)
                if out and type(out[-1]) is Removed:
                    out[-1].hashes.extend(hashes)  # vLLM sends a BlockRemoved per block: one apply per run
                else:
                    out.append(Removed(hashes))
        elif type(e) is _Stored:
            if _usable_stored(e):
                parent = e.parent_block_hash
                out.append(Stored(_ints(e.block_hashes), None if parent is None else block_hash(parent), e.token_ids,
                                  e.block_size))  # fmt: skip
        else:
            out.append(Cleared())
    return out


def _usable_stored(e: _Stored) -> bool:
    return (e.medium in _GPU and e.group_idx in (None, 0) and e.lora_id is None and e.lora_name is None
            and all(k is None for k in e.extra_keys or ()))  # fmt: skip


def _ints(hashes: list[Any]) -> list[int]:
    return hashes if all(type(h) is int for h in hashes) else [block_hash(h) for h in hashes]


def _decode_any(payload: bytes) -> list[KvEvent]:
    try:
        batch = _decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    events = batch[1] if isinstance(batch, list) and len(batch) >= 2 else None
    if isinstance(batch, dict):
        events = batch.get("events")
    if not isinstance(events, list):
        raise WireError("not a KV event batch [ts, events, ...]")
    try:
        return [e for e in map(_event, events) if e is not None]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise WireError(f"malformed KV event: {exc!r}") from None


def _event(event: Any) -> KvEvent | None:
    """One event, or None for a block the router's keys cannot stand for (or an unknown tag)."""
    tag = event[0] if isinstance(event, list) and event else event.get("type") if isinstance(event, dict) else None
    if tag == "BlockStored":
        _, f = _fields(event, STORED_FIELDS)
        if not _usable(f):
            return None
        parent = f.get("parent_block_hash")
        hashes = [block_hash(h) for h in f["block_hashes"]]
        return Stored(hashes, None if parent is None else block_hash(parent), f["token_ids"], int(f["block_size"]))
    if tag == "BlockRemoved":
        _, f = _fields(event, REMOVED_FIELDS)
        usable = f.get("medium") in _GPU and f.get("group_idx") in (None, 0)
        return Removed([block_hash(h) for h in f["block_hashes"]]) if usable else None
    if tag == "AllBlocksCleared":
        return Cleared()
    if not isinstance(tag, str):
        raise WireError(f"not a tagged KV event: {str(event)[:80]}")
    return None  # an event kind a later release added
