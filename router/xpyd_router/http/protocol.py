"""OpenAI request parsing, the fields only the router may set, and the router's SSE errors (hop bodies: handoff/)."""

from __future__ import annotations

from typing import Any

import orjson

from xpyd_http.errors import error_body

JsonObj = dict[str, Any]

# Request fields of the disaggregation protocols: the router writes them, a client never may. A worker
# obeys them (pulls KV from a host:port they name, pairs with a bootstrap room, pins a DP rank), so a
# client that could set them could make workers call out anywhere or collide with other requests.
RESERVED_FIELDS: frozenset[str] = frozenset(
    {
        "kv_transfer_params",  # vLLM KV connectors (NixlConnector, LMCache, Mooncake, P2P NCCL)
        "disaggregated_params",  # TensorRT-LLM / Dynamo
        "bootstrap_host",  # SGLang PD
        "bootstrap_port",
        "bootstrap_room",
        "bootstrap_pair_key",
        "decode_tp_size",
        "routed_dp_rank",
        "disagg_prefill_dp_rank",
        "data_parallel_rank",
        "pd_prefill_admission_ack",
        "decode_token_reservation_id",
    }
)
# vLLM merges `vllm_xargs` into SamplingParams.extra_args, where its KV connectors read
# extra_args["kv_transfer_params"]: the same field by a side door.
XARGS = "vllm_xargs"


class BadRequest(Exception):
    """The client's body is not a valid request; the message says why."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_body(raw: bytes, chat: bool) -> tuple[JsonObj, str]:
    """The request as a dict plus the prompt text used for prefix hashing."""
    if not raw:
        raise BadRequest("request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not RESERVED_FIELDS.isdisjoint(body):
        name = min(RESERVED_FIELDS.intersection(body))
        raise BadRequest(f"'{name}' is set by the router and may not be sent by clients; remove it", name)
    xargs = body.get(XARGS)
    if isinstance(xargs, dict) and not RESERVED_FIELDS.isdisjoint(xargs):
        name = f"{XARGS}.{min(RESERVED_FIELDS.intersection(xargs))}"
        raise BadRequest(f"'{name}' is set by the router and may not be sent by clients; remove it", name)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    return body, (_chat_text(body) if chat else _prompt_text(body))


def _prompt_text(body: JsonObj) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt)
        if all(isinstance(p, int) for p in prompt):
            return " ".join(map(str, prompt))
        if all(isinstance(p, list) for p in prompt):
            return " ".join(" ".join(map(str, p)) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids", "prompt")


def _chat_text(body: JsonObj) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a string 'role'", "messages")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        # The emulator's ChatML-like template, so prefix blocks line up with its cache blocks.
        parts.append(f"<|im_start|>{message['role']}\n{content if content is not None else ''}<|im_end|>\n")
    return "".join(parts)


def sse_error(message: str, kind: str = "upstream_error", code: int = 502) -> bytes:
    return b"data: " + error_body(message, kind, code) + b"\n\ndata: [DONE]\n\n"
