"""The baseline: a bare aiohttp handler that reads the body and returns a fixed completion-sized JSON."""

from __future__ import annotations

import sys

from aiohttp import web

BODY = (
    b'{"object":"text_completion","id":"cmpl-0123456789abcdef0123456789abcdef","created":1700000000,'
    b'"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"text":" the cat sat on the mat.'
    b' the cat sat on the mat. the cat sat o","logprobs":null,"finish_reason":"length","prompt_logprobs":null,'
    b'"stop_reason":null}],"usage":{"prompt_tokens":40,"total_tokens":56,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":32}},"system_fingerprint":null,"kv_transfer_params":null}'
)


async def handler(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


def main() -> None:
    import uvloop

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    uvloop.install()
    web.run_app(app, host=sys.argv[1], port=int(sys.argv[2]), access_log=None, print=None, backlog=2048)


if __name__ == "__main__":
    main()
