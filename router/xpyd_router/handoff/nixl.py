"""vLLM's handoff over a KV connector (NixlConnector): prefill for one token, then decode with its KV params.

The prefill hop is the client's request cut to one token, not streamed, asking the worker to keep the KV
for a remote decode; its reply's `kv_transfer_params` go verbatim into the decode hop, which is the
client's own request. Fields that cannot hold with max_tokens=1, or only cost on a hop whose token is
discarded, stay off the prefill hop and reach decode untouched, as vLLM's P/D proxy keeps them.
"""

from __future__ import annotations

from typing import Any

import orjson

from xpyd_http.messages import Answer, Reply
from xpyd_router.handoff.base import Handoff, JsonObj, Legs
from xpyd_router.http.replies import prefill_params

EMPTY_KV: JsonObj = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Off the prefill hop, kept for decode:
DECODE_ONLY: frozenset[str] = frozenset(
    {
        "stream_options",  # vLLM refuses it without stream=True
        "min_tokens",  # SamplingParams._verify_args: min_tokens must be <= max_tokens (1), else HTTP 400
        "min_completion_tokens",
        "best_of",  # older vLLM: best_of must be >= n, and n is 1 here
        "use_beam_search",  # beam search fans one request out into beams: decode's business
        "logprobs",  # per-token logprobs of a token nobody sees
        "top_logprobs",  # chat: needs logprobs=true
        "prompt_logprobs",  # logprobs over the whole prompt: the costliest extra on the prefill hop
        "echo",  # with logprobs it asks for prompt logprobs too
        "logprob_token_ids",  # needs logprobs
        "response_format",  # structured output: compiles a grammar for the one discarded token
        "structured_outputs",
        "guided_json",  # older vLLM's names of the same
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "structural_tag",
    }
)


def prefill_body(body: JsonObj) -> bytes:
    """Hop 1: one token, one sequence, not streamed, the KV kept for a remote decode."""
    hop = {k: v for k, v in body.items() if k not in DECODE_ONLY}
    hop["max_tokens"] = 1
    if "max_completion_tokens" in hop:
        hop["max_completion_tokens"] = 1
    if "n" in hop:
        hop["n"] = 1  # the prompt's KV is one, however many completions decode samples from it
    hop["stream"] = False
    hop["kv_transfer_params"] = dict(EMPTY_KV)
    return orjson.dumps(hop)


def decode_body(body: JsonObj, kv_transfer_params: Any) -> bytes:
    """Hop 2: the client's own request plus what prefill returned, passed on verbatim."""
    hop = dict(body)
    hop["kv_transfer_params"] = kv_transfer_params
    return orjson.dumps(hop)


class Nixl(Handoff):
    """Prefill, wait for its KV params, then decode: two hops in sequence."""

    name = "nixl"

    async def run(self, legs: Legs, body: JsonObj, prefill: str, decode: str) -> Answer:
        params = await legs.prefill(prefill, prefill_body(body), prefill_params)
        if isinstance(params, Reply):
            return params
        return await legs.decode(decode, decode_body(body, params))
