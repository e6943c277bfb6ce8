"""Fuzzing the router's client side: mutated JSON bodies and headers never cause a 5xx, a hang or a crash."""

from __future__ import annotations

import json
import string
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(120)
Start = Callable[..., Any]
KEYS = ["model", "prompt", "messages", "stream", "max_tokens", "max_completion_tokens", "stream_options",
        "kv_transfer_params", "vllm_xargs", "bootstrap_room", "n", "temperature", "logprobs", "stop", "role",
        "content", "text"]  # fmt: skip
PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]) | values, "content": st.text() | values}),
    max_size=3,
)
prompt = st.one_of(st.text(max_size=40), st.text(min_size=1, max_size=5).map(lambda t: t * 800), values)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=6),
    st.fixed_dictionaries(
        {"prompt": prompt, "messages": messages},
        optional={"stream": st.booleans() | values, "max_tokens": values, "vllm_xargs": values, "model": values},
    ),
)


def encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")  # NaN, huge ints: still sent


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    raw = encode(draw(bodies))
    if draw(st.booleans()):
        return raw
    data = bytearray(raw)
    for pos, insert in draw(st.lists(st.tuples(st.integers(0, max(len(data), 1)), st.binary(max_size=3)), max_size=4)):
        data[pos : pos + len(insert)] = insert
    return bytes(data)


headers = st.dictionaries(
    st.sampled_from(["X-Request-Timeout", "Content-Type", "Authorization", "Accept", "X-Data-Parallel-Rank"]),
    st.text(PRINTABLE, max_size=12),
    max_size=3,
)


@pytest.fixture
async def target(stubs: Start, router: Start) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    workers = [await stubs("prefill"), await stubs("decode"), await stubs("decode")]
    r = await router(workers, direct_below_blocks=2, scrape_interval=60, max_body_bytes=1 << 16, request_timeout=5)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=8)) as session:
        yield r.url, session
        async with session.get(r.url + "/health") as resp:
            assert resp.status == 200  # still serving, every worker still in rotation
            assert (await resp.json())["ready"] == {"prefill": 1, "decode": 2, "worker": 0}


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=raw_bodies(), extra=headers, chat=st.booleans())
async def test_mutated_requests_get_a_clean_answer(
    target: tuple[str, aiohttp.ClientSession], body: bytes, extra: dict[str, str], chat: bool
) -> None:
    url, session = target
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with session.post(url + path, data=body, headers=extra) as resp:  # a hang fails on the 8 s timeout
        raw = await resp.read()
        status, kind = resp.status, resp.content_type
    if status == 504:  # the client's own X-Request-Timeout ran out: its choice, not a router failure
        assert float(extra["X-Request-Timeout"]) < 5
        return
    assert status < 500, raw[:300]
    if status >= 400:
        error = orjson.loads(raw)["error"]
        assert error["type"] in ("invalid_request_error", "authentication_error")
        assert isinstance(error["message"], str)
    elif kind == "text/event-stream":
        assert raw.endswith(b"data: [DONE]\n\n")
    else:
        assert isinstance(orjson.loads(raw), dict)
