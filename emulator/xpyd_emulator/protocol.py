"""OpenAI request validation and vLLM-shaped responses, errors and SSE chunks (no I/O)."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from xpyd_emulator.errors import ApiError
from xpyd_emulator.peers import Bootstrap, bootstrap_fields
from xpyd_emulator.tokens import NONE_HASH, Ids, chain_hashes, render_chat, salted_seed, token_ids

__all__ = ["DONE", "ApiError", "ParsedRequest", "SseFormat", "full_response", "parse_request", "usage"]

_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count()
MAX_TOKEN_ID = 1 << 31


def request_id(chat: bool) -> str:
    """A unique id like vLLM's 32 hex digits: a random per-process prefix and a counter."""
    return f"{'chatcmpl-' if chat else 'cmpl-'}{_ID_PREFIX}{next(_ID_COUNTER):016x}"


@dataclass(slots=True)
class ParsedRequest:
    """A validated completion or chat request, reduced to what the engine needs."""

    chat: bool
    model: str
    prompt_tokens: int
    hashes: list[int]
    max_tokens: int
    finish_reason: str  # "length" when max_tokens was given, else "stop" (emulated EOS)
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None
    request_id: str
    created: int
    bootstrap: Bootstrap | None = None  # SGLang bootstrap_host/port/room
    tokens: Ids | None = None  # the prompt's token ids (with prefix caching on), for KV events
    data_parallel_rank: int | None = None  # the rank its X-data-parallel-rank header names (dp_routing.py)
    salt: str | None = None  # its cache_salt: its blocks are its own (tokens.salted_seed)


def _show(value: object) -> str:
    """A value for an error message, cut short (a client may send megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_param(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(f"{name} must be an integer, got {_show(value)}", param=name)
        if value < 1:
            raise ApiError(f"{name} must be at least 1, got {value}.", param=name)
        return value
    return None


def _check_sampling(body: dict[str, Any]) -> None:
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 1e-9, 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ApiError(f"{name} must be a number in [{low:g}, {high:g}], got {_show(value)}.", param=name)
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError(f"n must be 1 in the emulator, got {_show(n)}.", param="n")


def _check_min_tokens(value: object, max_tokens: int) -> None:
    """vLLM's SamplingParams._verify_args on min_tokens (its messages), against the max_tokens it runs with."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"min_tokens must be an integer, got {_show(value)}", param="min_tokens")
    if value < 0:
        raise ApiError(f"min_tokens must be greater than or equal to 0, got {value}.")
    if value > max_tokens:
        raise ApiError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {value}.")


def _chat_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list of {role, content} objects.", param="messages")
    clean: list[dict[str, object]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a string role.", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            content = "".join(t for t in texts if isinstance(t, str))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(f"messages[{i}].content must be a string or a list of parts.", param="messages")
        clean.append({"role": m["role"], "content": content})
    return render_chat(clean)


def _prompt(body: dict[str, Any]) -> Ids:
    prompt = body.get("prompt")
    if type(prompt) is str:  # the common case first
        return token_ids(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return token_ids(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(not 0 <= t < MAX_TOKEN_ID for t in prompt):
            raise ApiError(f"token ids must be in [0, {MAX_TOKEN_ID}).", param="prompt")
        return np.asarray(prompt, dtype=np.int64)
    if prompt is None:
        raise ApiError("prompt is required.", param="prompt")
    raise ApiError("prompt must be a string, a list of token ids, or a list of one of those.", param="prompt")


def parse_request(
    raw: bytes,
    *,
    chat: bool,
    served: list[str],
    max_model_len: int,
    block_size: int,
    hash_blocks: bool,
    default_output_tokens: int,
    sglang: bool = False,
) -> ParsedRequest:
    """Validate a request body; raises ApiError (400 bad input, 404 unknown model)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object.")
    model = body.get("model") or served[0]
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {type(model).__name__}.", param="model")
    if model not in served:
        raise ApiError(f"The model `{model[:100]}` does not exist.", status=404, param="model")
    if "temperature" in body or "top_p" in body or "n" in body:
        _check_sampling(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(f"stream must be a boolean, got {_show(stream)}.", param="stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object.", param="stream_options")
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ApiError("kv_transfer_params must be an object.", param="kv_transfer_params")
    ids = token_ids(_chat_text(body.get("messages"))) if chat else _prompt(body)
    n_prompt = len(ids)
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    hashes = chain_hashes(ids, block_size, seed=salted_seed(salt) if salt else NONE_HASH) if hash_blocks else []
    if n_prompt == 0:
        raise ApiError("The prompt cannot be empty.", param="prompt")
    asked = body.get("max_tokens")
    if chat or type(asked) is not int or asked < 1:  # the fast path is a plain positive max_tokens
        asked = _int_param(body, "max_completion_tokens", "max_tokens") if chat else _int_param(body, "max_tokens")
    if asked is None:
        max_tokens = 16 if not chat else min(default_output_tokens, max(1, max_model_len - n_prompt))
    else:
        max_tokens = asked
    if n_prompt + max_tokens > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="input_tokens",
        )
    if body.get("min_tokens") is not None:  # vLLM runs an unbounded chat request to the end of the context
        _check_min_tokens(body["min_tokens"], max_tokens if asked is not None or not chat else max_model_len - n_prompt)
    return ParsedRequest(
        chat=chat,
        model=model,
        prompt_tokens=n_prompt,
        hashes=hashes,
        max_tokens=max_tokens,
        finish_reason="length" if asked is not None or not chat else "stop",
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        kv_transfer_params=kv,
        request_id=request_id(chat),
        created=int(time.time()),
        bootstrap=bootstrap_fields(body) if sglang else None,
        tokens=ids if hash_blocks else None,
        salt=salt,
    )


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def full_response(req: ParsedRequest, text: str, finish: str, use: dict[str, Any], kv: dict[str, Any] | None) -> bytes:
    """The non-streamed completion or chat.completion body."""
    head = {"id": req.request_id, "created": req.created, "model": req.model}
    if req.chat:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": [],
        }
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        doc = {"object": "chat.completion", **head, "choices": [choice]}
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "prompt_logprobs": None,
        }
        doc = {"object": "text_completion", **head, "choices": [choice]}
    choice["stop_reason"] = None
    doc.update(usage=use, system_fingerprint=None, kv_transfer_params=kv)
    return orjson.dumps(doc)


class SseFormat:
    """Pre-built byte templates for one request's SSE chunks, as vLLM streams them."""

    __slots__ = ("_head", "_tail", "req")

    def __init__(self, req: ParsedRequest) -> None:
        self.req = req
        kind = "chat.completion.chunk" if req.chat else "text_completion"
        model = orjson.dumps(req.model).decode()
        self._head = (
            f'data: {{"id":"{req.request_id}","object":"{kind}","created":{req.created},"model":{model},'
            f'"choices":[{{"index":0,'
        ).encode()
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _payload(self, text: str) -> bytes:
        value = orjson.dumps(text)
        return (b'"delta":{"content":' + value + b"}") if self.req.chat else (b'"text":' + value)

    def role(self) -> bytes:
        """The first chat chunk carrying the assistant role (chat only)."""
        return self._head + b'"delta":{"role":"assistant","content":""}' + self._tail

    def token(self, text: str) -> bytes:
        return self._head + self._payload(text) + self._tail

    def last(self, text: str, finish: str) -> bytes:
        tail = b',"logprobs":null,"finish_reason":"' + finish.encode() + b'","stop_reason":null}]}\n\n'
        return self._head + self._payload(text) + tail

    def usage(self, use: dict[str, Any]) -> bytes:
        kind = "chat.completion.chunk" if self.req.chat else "text_completion"
        req = self.req
        doc = {"id": req.request_id, "object": kind, "created": req.created, "model": req.model,
               "choices": [], "usage": use}  # fmt: skip
        return b"data: " + orjson.dumps(doc) + b"\n\n"


DONE = b"data: [DONE]\n\n"
