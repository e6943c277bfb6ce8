"""The KV handoff seam: one module per protocol, picked from the engine profile; vLLM's hop bodies."""

from __future__ import annotations

import inspect
from typing import Any

import orjson
import pytest

from xpyd_api import engines
from xpyd_router import handoff, hops, proxy
from xpyd_router.cli import UsageError, parser
from xpyd_router.handoff.bootstrap import Bootstrap
from xpyd_router.handoff.nixl import DECODE_ONLY, Nixl, decode_body, prefill_body
from xpyd_router.http import protocol
from xpyd_router.metrics import RouterMetrics
from xpyd_router.policy.registry import KvAwarePolicy
from xpyd_router.pool import WorkerPool

BASE: dict[str, Any] = {"model": "m", "prompt": "p", "max_tokens": 50, "stream": True}


@pytest.mark.parametrize(
    ("field", "value"),
    [  # each conflicts with max_tokens=1 (vLLM answers 400) or costs on a token nobody reads
        ("min_tokens", 8),  # "min_tokens must be less than or equal to max_tokens=1"
        ("min_completion_tokens", 8),
        ("stream_options", {"include_usage": True}),  # refused without stream=True
        ("best_of", 3),
        ("use_beam_search", True),
        ("logprobs", 5),
        ("top_logprobs", 3),
        ("prompt_logprobs", 1),
        ("echo", True),
        ("logprob_token_ids", [1, 2]),
        ("response_format", {"type": "json_object"}),
        ("structured_outputs", {"json": {"type": "object"}}),
        ("guided_json", {"type": "object"}),
        ("guided_regex", "a+"),
        ("guided_choice", ["a", "b"]),
        ("guided_grammar", "root ::= 'a'"),
        ("structural_tag", "{}"),
    ],
)
def test_fields_that_cannot_hold_on_the_prefill_hop_go_to_decode_only(field: str, value: Any) -> None:
    body = {**BASE, field: value}
    first = orjson.loads(prefill_body(body))
    second = orjson.loads(decode_body(body, {"remote_block_ids": [1]}))
    assert field not in first
    assert second[field] == value
    assert (first["max_tokens"], first["stream"]) == (1, False)
    assert body[field] == value  # the client's body is untouched


@pytest.mark.parametrize(
    ("field", "value", "on_prefill"),
    [
        ("n", 3, 1),  # one prompt KV, however many samples decode draws
        ("max_completion_tokens", 40, 1),
        ("ignore_eos", True, True),  # harmless at one token: kept
        ("temperature", 0.3, 0.3),
        ("stop", ["\n"], ["\n"]),
        ("tools", [{"type": "function"}], [{"type": "function"}]),  # rendered into the prompt: must stay
        ("tool_choice", "none", "none"),  # may change the rendered prompt: must stay
        ("cache_salt", "tenant", "tenant"),  # namespaces the prompt's KV: both hops alike
    ],
)
def test_fields_kept_or_set_on_the_prefill_hop(field: str, value: Any, on_prefill: Any) -> None:
    first = orjson.loads(prefill_body({**BASE, field: value}))
    assert first[field] == on_prefill
    assert first["kv_transfer_params"]["do_remote_decode"] is True
    assert DECODE_ONLY.isdisjoint(first)


@pytest.mark.parametrize(
    ("kind", "module"),
    [("vllm", Nixl), ("emulator", Nixl), ("sglang", Bootstrap)],
)
def test_the_handoff_comes_from_the_engine_profile(kind: str, module: type[handoff.Handoff]) -> None:
    chosen = handoff.for_engine(kind, 8998)
    assert type(chosen) is module
    assert chosen.name == engines.newest(kind).handoff


@pytest.mark.parametrize("kind", ["tgi", "", "VLLM"])
def test_an_unknown_engine_kind_never_becomes_vllm(kind: str) -> None:
    with pytest.raises(engines.EngineUnsupported):
        handoff.for_engine(kind, 8998)
    with pytest.raises(engines.EngineUnsupported):
        proxy.Proxy(WorkerPool(KvAwarePolicy(), 256), RouterMetrics("t"), proxy.ProxyConfig(engine=kind))
    with pytest.raises(UsageError, match="invalid choice"):
        parser().parse_args(["--engine", kind or "none", "--worker", "http://127.0.0.1:8000"])


def test_every_protocol_has_a_module_and_the_flag_takes_every_kind() -> None:
    assert {engines.newest(k).handoff for k in engines.KINDS} == {"nixl", "bootstrap"}
    assert {handoff.make(p, 1).name for p in ("nixl", "bootstrap")} == {"nixl", "bootstrap"}
    engine = next(a for a in parser()._actions if "--engine" in a.option_strings)
    assert tuple(engine.choices or ()) == engines.KINDS


@pytest.mark.parametrize("module", [hops, proxy, protocol])
def test_no_engine_branch_outside_the_handoff_modules(module: object) -> None:
    source = inspect.getsource(module)  # type: ignore[arg-type]
    assert '"sglang"' not in source and "'sglang'" not in source
