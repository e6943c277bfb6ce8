"""The protocol belongs to the router: clients cannot set its fields, and never see a worker's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from router_harness import Router  # type: ignore[import-not-found]
from stub_workers import SECRET_ENGINE, SIDE_CHANNEL, Stub, call, events  # type: ignore[import-not-found]

from xpyd_router.http.protocol import RESERVED_FIELDS, BadRequest, parse_body

pytestmark = pytest.mark.timeout(30)
Start = Callable[..., Any]
LONG = "You are a helpful assistant. " * 40  # 4 router blocks: two hops unless direct_below_blocks says so

# Each protocol's request fields, as their sources name them: vLLM's KV connectors, SGLang's PD
# bootstrap and DP routing, TensorRT-LLM's disaggregated params.
KNOWN_RESERVED = [
    "kv_transfer_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "decode_tp_size",
    "routed_dp_rank",
    "disagg_prefill_dp_rank",
    "data_parallel_rank",
    "pd_prefill_admission_ack",
    "decode_token_reservation_id",
    "disaggregated_params",
]


@pytest.mark.parametrize("name", KNOWN_RESERVED)
@pytest.mark.parametrize("chat", [False, True])
def test_every_reserved_field_is_refused_by_name(name: str, chat: bool) -> None:
    assert name in RESERVED_FIELDS
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    body[name] = {"remote_host": "10.0.0.1", "remote_port": 80} if name.endswith("params") else 1
    with pytest.raises(BadRequest, match=f"'{name}' is set by the router") as info:
        parse_body(orjson.dumps(body), chat)
    assert info.value.param == name


def test_kv_transfer_params_through_vllm_xargs_is_refused() -> None:
    """vLLM copies vllm_xargs into SamplingParams.extra_args, where its connectors read kv_transfer_params."""
    raw = orjson.dumps({"prompt": "hi", "vllm_xargs": {"kv_transfer_params": {"remote_host": "10.0.0.1"}}})
    with pytest.raises(BadRequest, match="vllm_xargs.kv_transfer_params") as info:
        parse_body(raw, False)
    assert info.value.param == "vllm_xargs.kv_transfer_params"
    assert parse_body(orjson.dumps({"prompt": "hi", "vllm_xargs": {"my_knob": 1}}), False)[0]["vllm_xargs"]


async def topology(kind: str, stubs: Start, router: Start, mode: str = "ok") -> tuple[Router, list[Stub]]:
    if kind == "colocated":
        workers = [await stubs("worker", mode), await stubs("worker", mode)]
        return await router(workers), workers
    workers = [await stubs("prefill", mode), await stubs("decode", mode)]
    return await router(workers, direct_below_blocks=100 if kind == "direct" else 0), workers


def request(chat: bool, prompt: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    if chat:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **extra}
    return "/v1/completions", {"prompt": prompt, **extra}


HOSTILE = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_block_ids": [1],
           "remote_host": "127.0.0.1", "remote_port": 9, "do_remote_decode": True}  # fmt: skip


@pytest.mark.parametrize("kind", ["two-hop", "direct", "colocated"])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    ("field", "value"), [("kv_transfer_params", HOSTILE), ("bootstrap_host", "127.0.0.1"), ("bootstrap_room", 7)]
)
async def test_reserved_fields_are_refused_on_every_path(
    kind: str, chat: bool, field: str, value: Any, stubs: Start, router: Start
) -> None:
    r, workers = await topology(kind, stubs, router)
    path, body = request(chat, "hi" if kind == "direct" else LONG, **{field: value})
    status, raw = await call(r.url, body, path)
    assert status == 400
    error = orjson.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == field
    assert field in error["message"]
    assert [w.calls for w in workers] == [0, 0]  # no worker saw it


async def test_a_hostile_request_cannot_take_decode_out_of_rotation(stubs: Start, router: Start) -> None:
    """The reported repro: direct-to-decode with the client's kv_transfer_params failed later users."""
    r, (_, decode) = await topology("direct", stubs, router)
    status, _ = await call(r.url, {"prompt": "hi", "kv_transfer_params": HOSTILE})
    assert status == 400
    others = [await call(r.url, {"prompt": f"user {i}"}) for i in range(40)]
    assert [s for s, _ in others] == [200] * 40
    assert r.pool.workers[decode.url].healthy


@pytest.mark.parametrize("kind", ["two-hop", "direct", "colocated"])
@pytest.mark.parametrize("stream", [False, True])
async def test_workers_kv_transfer_params_never_reach_the_client(
    kind: str, stream: bool, stubs: Start, router: Start
) -> None:
    r, workers = await topology(kind, stubs, router, mode="leak")
    status, raw = await call(r.url, request(False, "hi" if kind == "direct" else LONG, stream=stream)[1])
    assert status == 200, raw
    assert SECRET_ENGINE.encode() not in raw
    assert SIDE_CHANNEL.encode() not in raw
    assert b"kv_transfer_params" not in raw
    if stream:
        got = events(raw)
        assert got[-1] == "[DONE]"
        assert [e["choices"][0]["text"] for e in got[:-1]] == ["t0", "t1", "t2", "t3"]
    else:
        assert orjson.loads(raw)["choices"][0]["text"] == "hello"
    if kind == "two-hop":  # the decode hop got prefill's params, written by the router
        assert workers[1].bodies[-1]["kv_transfer_params"]["remote_engine_id"] == SECRET_ENGINE
