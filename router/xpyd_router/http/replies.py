"""Worker replies checked before a client sees them: JSON bodies, SSE events, protocol fields removed."""

from __future__ import annotations

from typing import Any

import orjson

# Protocol fields a worker may put in its reply (its engine id, side-channel host and port, block
# ids): they are for the router, never for a client.
REPLY_FIELDS: frozenset[str] = frozenset({"kv_transfer_params", "disaggregated_params"})
MAX_EVENT_BYTES = 4 << 20  # one SSE event larger than this is garbage, not a token
_DONE = b"[DONE]"
_SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")


class BadReply(Exception):
    """A worker answered 2xx with something that is not a valid OpenAI reply."""


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadReply(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise BadReply(f"{what} is not a JSON object")
    return doc


_NULL_PARAMS = b',"kv_transfer_params":null}'  # how vLLM (and the emulator) end a plain reply


def json_reply(data: bytes) -> bytes:
    """A non-streamed 2xx body, validated (an object with a `choices` list), without protocol fields
    (re-encoded only if it had some).

    The usual reply, a compact JSON object with a `choices` list that names no protocol field but a
    trailing `"kv_transfer_params":null`, is checked and trimmed by its bytes; anything else is parsed.
    """
    if data[:1] == b"{" and b'"choices":[' in data and _FIELD_BYTES[0] not in data:
        if data.endswith(_NULL_PARAMS) and data.count(_FIELD_BYTES[1]) == 1:
            return data[: -len(_NULL_PARAMS)] + b"}"
        if data[-1:] == b"}" and _FIELD_BYTES[1] not in data:
            return data
    doc = _object(data, "reply body")
    if not isinstance(doc.get("choices"), list):
        raise BadReply("reply body has no choices list")
    if REPLY_FIELDS.isdisjoint(doc):
        return data
    for name in REPLY_FIELDS:
        doc.pop(name, None)
    return orjson.dumps(doc)


def prefill_params(data: bytes) -> dict[str, Any]:
    """The kv_transfer_params of a vLLM prefill reply; BadReply if it has none."""
    params = _object(data, "prefill reply").get("kv_transfer_params")
    if not isinstance(params, dict) or not params:
        raise BadReply("prefill reply has no kv_transfer_params")
    return params


_FIELD_BYTES = tuple(f'"{name}"'.encode() for name in sorted(REPLY_FIELDS))


def _usual(event: bytes) -> bool:
    """True for the usual event: one `data: {...}` line that names no protocol field, told by its bytes
    (a stream's first event, and any event that does not look like this, gets the full JSON check)."""
    return (
        event[:7] == b"data: {"
        and event[-1:] == b"}"
        and b"\n" not in event
        and _FIELD_BYTES[0] not in event
        and _FIELD_BYTES[1] not in event
    )


class SseFilter:
    """Cuts an upstream byte stream into SSE events, checks each and passes on whole events only."""

    __slots__ = ("_buf", "done", "trusted")

    def __init__(self) -> None:
        self._buf = b""
        self.done = False  # `data: [DONE]` seen
        self.trusted = False  # the first event parsed as JSON: the worker speaks OpenAI SSE

    def feed(self, chunk: bytes) -> bytes:
        """The complete, checked events so far (b"" while an event is still partial)."""
        if (
            self.trusted
            and not self._buf
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1:] == b"\n"
            and _usual(chunk[:-2])
        ):
            return chunk  # the usual network read: exactly one event
        data = self._buf + chunk if self._buf else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > MAX_EVENT_BYTES:
                raise BadReply("SSE event too large")
            self._buf = data
            return b""
        whole, self._buf = data[: end + 2], data[end + 2 :]
        changed = False
        events = whole[:-2].split(b"\n\n")
        for i, event in enumerate(events):
            if self.trusted and _usual(event):
                continue
            fixed = self._check(event)
            if fixed is not None:
                events[i] = fixed
                changed = True
        return b"\n\n".join(events) + b"\n\n" if changed else whole

    def finish(self) -> None:
        """At the end of the upstream body: nothing may be left half-sent, and [DONE] must have come."""
        if self._buf.strip():
            raise BadReply("stream ended inside an SSE event")
        if not self.done:
            raise BadReply("stream ended without data: [DONE]")

    def _check(self, event: bytes) -> bytes | None:
        """None if the event is fine as it is, else its replacement without protocol fields."""
        lines = event.split(b"\n")
        changed = False
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == _DONE:
                    self.done = True
                    continue
                doc = _object(payload, "SSE event")
                self.trusted = True
                if not REPLY_FIELDS.isdisjoint(doc):
                    for name in REPLY_FIELDS:
                        doc.pop(name, None)
                    lines[i] = b"data: " + orjson.dumps(doc)
                    changed = True
            elif line and not line.startswith(_SSE_FIELDS):
                raise BadReply("stream line is not an SSE field")
        return b"\n".join(lines) if changed else None
