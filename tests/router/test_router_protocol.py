"""OpenAI body parsing and the per-hop bodies of the two disaggregation protocols."""

from __future__ import annotations

import orjson
import pytest

from xpyd_http.errors import error_body
from xpyd_router.handoff.bootstrap import bootstrap_bodies
from xpyd_router.handoff.nixl import decode_body, prefill_body
from xpyd_router.http.protocol import BadRequest, parse_body, sse_error


@pytest.mark.parametrize(
    ("raw", "chat", "message"),
    [
        (b"", False, "empty"),
        (b"{not json", False, "not valid JSON"),
        (b"[1, 2]", False, "JSON object"),
        (b'{"model": "m"}', False, "'prompt' must be"),
        (b'{"prompt": 5}', False, "'prompt' must be"),
        (b'{"prompt": "x", "stream": "yes"}', False, "'stream' must be a boolean"),
        (b'{"messages": []}', True, "'messages' must be a non-empty list"),
        (b'{"messages": [{"content": "hi"}]}', True, "string 'role'"),
    ],
)
def test_bad_bodies_are_named(raw: bytes, chat: bool, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_body(raw, chat)


@pytest.mark.parametrize(
    ("body", "chat", "text"),
    [
        ({"prompt": "hello"}, False, "hello"),
        ({"prompt": ["a", "b"]}, False, "ab"),
        ({"prompt": [1, 2, 3]}, False, "1 2 3"),
        ({"messages": [{"role": "user", "content": "hi"}]}, True, "<|im_start|>user\nhi<|im_end|>\n"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            True,
            "<|im_start|>user\nhi<|im_end|>\n",
        ),
    ],
)
def test_prompt_text_for_hashing(body: dict[str, object], chat: bool, text: str) -> None:
    assert parse_body(orjson.dumps(body), chat) == (body, text)


def test_prefill_body_asks_for_one_token_and_a_remote_decode() -> None:
    body = {
        "prompt": "p",
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "stream": True,
        "stream_options": {},
    }
    hop = orjson.loads(prefill_body(body))
    assert hop["max_tokens"] == 1
    assert hop["max_completion_tokens"] == 1
    assert hop["stream"] is False
    assert "stream_options" not in hop
    assert hop["kv_transfer_params"]["do_remote_decode"] is True
    assert hop["kv_transfer_params"]["do_remote_prefill"] is False
    assert body["max_tokens"] == 50  # the client's body is untouched


def test_decode_body_restores_the_request_with_prefills_params() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "127.0.0.1"}
    hop = orjson.loads(decode_body({"prompt": "p", "max_tokens": 50, "stream": True}, params))
    assert hop == {"prompt": "p", "max_tokens": 50, "stream": True, "kv_transfer_params": params}


def test_sglang_bootstrap_pairs_both_hops() -> None:
    first, second = bootstrap_bodies({"prompt": "p", "stream": True}, "http://127.0.0.5:30000", 8998)
    a, b = orjson.loads(first), orjson.loads(second)
    assert a["bootstrap_host"] == b["bootstrap_host"] == "127.0.0.5"
    assert a["bootstrap_room"] == b["bootstrap_room"]
    assert a["bootstrap_port"] == 8998
    assert a["stream"] is False
    assert b["stream"] is True


def test_error_shapes() -> None:
    assert orjson.loads(error_body("nope", "invalid_request_error", 400, "prompt")) == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "prompt", "code": 400}
    }
    event = sse_error("boom")
    assert event.startswith(b"data: {")
    assert event.endswith(b"data: [DONE]\n\n")
    assert orjson.loads(event.split(b"\n\n")[0][6:])["error"]["message"] == "boom"
