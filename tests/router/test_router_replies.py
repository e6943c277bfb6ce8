"""Worker replies checked before a client sees them: SSE events cut whole, garbage refused, fields stripped."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpyd_router.http.replies import MAX_EVENT_BYTES, BadReply, SseFilter, json_reply, prefill_params

STREAM = b"".join(b'data: {"choices": [{"text": "t%d"}]}\n\n' % i for i in range(5)) + b": ping\n\ndata: [DONE]\n\n"


def run(chunks: list[bytes]) -> bytes:
    sse = SseFilter()
    out = b"".join(sse.feed(c) for c in chunks)
    sse.finish()
    return out


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_of_a_valid_stream_passes_unchanged_in_whole_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    sse = SseFilter()
    out = b""
    for c in chunks:
        part = sse.feed(c)
        assert part == b"" or part.endswith(b"\n\n")  # never half an event
        out += part
    sse.finish()
    assert out == STREAM


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([b"data: {oops\n\n"], "SSE event is not JSON"),
        ([b"data: {oops}\n\n"], "SSE event is not JSON"),  # a stream's first event is always parsed
        ([b'data: {"a": 1}\n\n', b"data: {oops\n\n"], "SSE event is not JSON"),
        ([b"data: [1, 2]\n\n"], "not a JSON object"),
        ([b"<html>bad gateway</html>\n\n"], "not an SSE field"),
        ([b'data: {"a": 1}\n\n', b'data: {"a": '], "ended inside an SSE event"),
        ([b'data: {"a": 1}\n\n'], "without data: \\[DONE\\]"),
        ([b"data: " + b"x" * (MAX_EVENT_BYTES + 1)], "too large"),
    ],
)
def test_bad_streams_are_refused(chunks: list[bytes], message: str) -> None:
    with pytest.raises(BadReply, match=message):
        run(chunks)


@pytest.mark.parametrize("first", [[], [b'data: {"choices":[]}\n\n']], ids=["first event", "later event"])
def test_protocol_fields_are_stripped_from_events(first: list[bytes]) -> None:
    leak = {"choices": [], "kv_transfer_params": {"remote_engine_id": "e", "remote_host": "10.1.2.3"}}
    out = run([*first, b"data: " + orjson.dumps(leak) + b"\n\n", b"data: [DONE]\n\n"])
    assert out == b"".join(first) + b'data: {"choices":[]}\n\ndata: [DONE]\n\n'


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b'{"choices": []}', b'{"choices": []}'),  # untouched bytes when there is nothing to strip
        (b'{"choices": [], "kv_transfer_params": {"remote_host": "10.1.2.3"}}', b'{"choices":[]}'),
        (b'{"choices": [], "kv_transfer_params": null}', b'{"choices":[]}'),
        # the usual compact reply: checked and trimmed by its bytes
        (b'{"id":"x","choices":[{"text":"a"}],"kv_transfer_params":null}', b'{"id":"x","choices":[{"text":"a"}]}'),
        (b'{"choices":[{"text":"\\"kv_transfer_params\\""}]}', b'{"choices":[{"text":"\\"kv_transfer_params\\""}]}'),
        (b'{"choices":[],"x":{"kv_transfer_params":null}}', b'{"choices":[],"x":{"kv_transfer_params":null}}'),
        (b'{"choices":[],"kv_transfer_params":{"remote_host":"h"}}', b'{"choices":[]}'),
        (b'{"choices":[],"disaggregated_params":{},"kv_transfer_params":null}', b'{"choices":[]}'),
    ],
)
def test_json_replies(body: bytes, want: bytes) -> None:
    assert json_reply(body) == want


@pytest.mark.parametrize(
    "body", [b"", b"<html>", b"[]", b'"text"', b'{"choices":[1', b'{"choices":[1],"kv_transfer_params":null']
)
def test_non_object_replies_are_refused(body: bytes) -> None:
    with pytest.raises(BadReply):
        json_reply(body)


@pytest.mark.parametrize(
    "body", [b"{}", b'{"kv_transfer_params": null}', b'{"kv_transfer_params": {}}', b'{"kv_transfer_params": [1]}']
)
def test_a_prefill_reply_needs_kv_transfer_params(body: bytes) -> None:
    with pytest.raises(BadReply, match="no kv_transfer_params"):
        prefill_params(body)
    assert prefill_params(b'{"kv_transfer_params": {"remote_block_ids": [1]}}') == {"remote_block_ids": [1]}


@pytest.mark.parametrize("body", [b"{}", b'{"object": "garbage"}', b'{"choices": null}', b'{"choices": {"0": 1}}'])
def test_a_json_object_without_choices_is_not_an_answer(body: bytes) -> None:
    """A 200 whose JSON object is no completion (bench/reliability case 5) is retried, never relayed."""
    with pytest.raises(BadReply, match="no choices"):
        json_reply(body)
