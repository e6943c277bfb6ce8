"""Engine KV-event payloads decoded into the three facts the router uses: stored, removed, cleared.

vLLM and SGLang send a msgpack batch [ts, events, dp_rank] (vLLM < the map encoding of
vllm-project/vllm#42892 and SGLang: every event a tagged array; after it each event is a map
with a "type" key). Stored: block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, then fields later releases appended (lora_name, extra_keys, group_idx, ...; SGLang may
put a metadata map 8th). SGLang 0.5.23 sends maps too, with `cache_salt`, `session_id` and `lora_name`
top-level. Hashes are 64-bit ints, or bytes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
A salted block (SGLang's `cache_salt`, vLLM's salt as the first block's only extra key) is keyed
under its salt (`block_keys.salt_root`): it matches only prompts sent with that salt. Blocks the
router's keys cannot stand for are dropped: LoRA blocks, other extra keys (media, prompt embeddings),
other KV-cache groups (hybrid models). A block's medium is its tier: GPU (or none given), or CPU for an
engine that offloads KV to host memory (vLLM's OffloadingConnector publishes those with their GPU
block hashes and no tokens); blocks of other media (disk tiers) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx")  # fmt: skip
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
GPU, CPU = "GPU", "CPU"  # the media the router keeps: the engine's own blocks and its CPU tier's
_MEDIA = {None: GPU, "GPU": GPU, "gpu": GPU, "CPU": CPU, "cpu": CPU}


class WireError(ValueError):
    """A payload that is not an engine KV-event batch."""


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: list[int]
    parent: int | None
    tokens: list[int]
    block_size: int
    salt: str | None = None  # the request's cache_salt (read for a chain's first block: the rest chain on it)
    medium: str = GPU  # the tier that now holds the blocks: GPU, or CPU (offloaded)


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: list[int]
    medium: str = GPU  # the tier that no longer holds them


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


def _salt(f: dict[str, Any]) -> tuple[bool, str | None]:
    """(keyable, salt) of a stored block run: unkeyable when its extra keys are more than a salt.

    vLLM publishes one extra-keys entry per block: its LoRA name, media pairs, the salt (the first
    block of a prompt only) and prompt-embedding digests, untagged; a first block whose only key is
    one string is salted by it (were it a lone embedding digest, no prompt's salt would match it)."""
    salt = f.get("cache_salt") or (f.get("metadata") or {}).get("cache_salt")
    extra: list[Any] = list(f.get("extra_keys") or ())
    if all(k is None for k in extra):
        return True, str(salt) if salt else None
    head, rest = extra[0], extra[1:]
    lone = isinstance(head, list | tuple) and len(head) == 1 and isinstance(head[0], str) and bool(head[0])
    if f.get("parent_block_hash") is None and lone and all(k is None for k in rest) and not salt:
        return True, str(head[0])
    return False, None


def _usable(f: dict[str, Any]) -> bool:
    """Blocks of the base model, on the GPU or its CPU tier, in the first KV-cache group."""
    return (_MEDIA.get(f.get("medium")) is not None and f.get("group_idx") in (None, 0) and f.get("lora_id") is None
            and f.get("lora_name") is None)  # fmt: skip


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
            medium = _MEDIA.get(e.medium)
            if medium is not None and e.group_idx in (None, 0):
                hashes = _ints(e.block_hashes)
                last = out[-1] if out else None
                if type(last) is Removed and last.medium == medium:
                    last.hashes.extend(hashes)  # vLLM sends a BlockRemoved per block: one apply per run
                else:
                    out.append(Removed(hashes, medium))
        elif type(e) is _Stored:
            if _usable_stored(e):
                parent = e.parent_block_hash
                keyable, salt = (
                    (True, None)
                    if e.extra_keys is None
                    else _salt({"extra_keys": e.extra_keys, "parent_block_hash": parent})
                )
                if keyable:
                    out.append(Stored(_ints(e.block_hashes), None if parent is None else block_hash(parent),
                                      e.token_ids, e.block_size, salt, _MEDIA[e.medium]))  # fmt: skip
        else:
            out.append(Cleared())
    return out


def _usable_stored(e: _Stored) -> bool:
    return e.medium in _MEDIA and e.group_idx in (None, 0) and e.lora_id is None and e.lora_name is None


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
        keyable, salt = _salt(f)
        if not _usable(f) or not keyable:
            return None
        parent = f.get("parent_block_hash")
        hashes = [block_hash(h) for h in f["block_hashes"]]
        tokens, size = f["token_ids"], int(f["block_size"])
        medium = _MEDIA[f.get("medium")]
        return Stored(hashes, None if parent is None else block_hash(parent), tokens, size, salt, medium)
    if tag == "BlockRemoved":
        _, f = _fields(event, REMOVED_FIELDS)
        tier = _MEDIA.get(f.get("medium"))
        usable = tier is not None and f.get("group_idx") in (None, 0)
        return Removed([block_hash(h) for h in f["block_hashes"]], tier) if usable and tier else None
    if tag == "AllBlocksCleared":
        return Cleared()
    if not isinstance(tag, str):
        raise WireError(f"not a tagged KV event: {str(event)[:80]}")
    return None  # an event kind a later release added
