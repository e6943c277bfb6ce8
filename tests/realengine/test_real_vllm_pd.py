"""The router in front of two real CPU vLLM engines doing a prefill/decode handoff over NIXL."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from testkit.promtext import metric_sum

from xpyd_cluster import realvllm

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(900)]

# A prompt of a few 32-token blocks: KV events name only full blocks.
LONG_PROMPT = (
    "The router sends each request to the worker that already holds the longest prefix of the prompt. "
    "A prefill engine computes the prompt's KV cache once, and a decode engine reads it over NIXL. "
    "Tell me a story about a cat who lived on a boat, one two three four five six seven eight nine ten."
)
TIMEOUT = httpx.Timeout(300.0, connect=5.0)


def scrape(url: str) -> str:
    r = httpx.get(url + "/metrics", timeout=10.0)
    r.raise_for_status()
    return r.text


def post(stack: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(stack.router + path, json={"model": stack.model, **body}, timeout=TIMEOUT)
    assert r.status_code == 200, f"{path} -> HTTP {r.status_code}: {r.text[:1000]}"
    out: dict[str, Any] = r.json()
    return out


def completion(stack: Any, **body: Any) -> dict[str, Any]:
    return post(stack, "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4, **body})


def chat(stack: Any, content: str = "Hello, world! How are you today?", **body: Any) -> dict[str, Any]:
    return post(stack, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], **body})


def wait_for(fn: Any, timeout: float = 20.0) -> Any:
    """fn() until it is truthy or the time is up; the last value either way."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.25)


def test_models_offline_by_hub_name(real_stack: Any) -> None:
    r = httpx.get(real_stack.prefill + "/v1/models", timeout=10.0)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [realvllm.MODEL_REPO]


def test_completion_through_router(real_stack: Any) -> None:
    out = completion(real_stack, max_tokens=4)
    choice = out["choices"][0]
    assert isinstance(choice["text"], str)
    assert 1 <= out["usage"]["completion_tokens"] <= 4
    assert choice["finish_reason"] in ("length", "stop")


def test_chat_through_router(real_stack: Any) -> None:
    out = chat(real_stack, max_tokens=4)
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    assert 1 <= out["usage"]["completion_tokens"] <= 4


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_ends_with_done(real_stack: Any, path: str) -> None:
    body: dict[str, Any] = {"model": real_stack.model, "max_tokens": 4, "stream": True}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "Tell me a story about a cat."}]
    else:
        body["prompt"] = LONG_PROMPT
    data: list[str] = []
    with httpx.stream("POST", real_stack.router + path, json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read().decode()[:1000]
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                data.append(line.removeprefix("data:").strip())
    assert data, "no SSE data lines"
    assert data[-1] == "[DONE]", data[-3:]
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] in ("text_completion", "chat.completion.chunk") for c in chunks)
    assert any(c["choices"] for c in chunks)


def test_sampling_fields_accepted(real_stack: Any) -> None:
    out = completion(
        real_stack, max_tokens=3, temperature=0.7, top_p=0.9, top_k=20, seed=7, stop=["\n\n"], n=1, logprobs=2,
        presence_penalty=0.5, frequency_penalty=0.5,
    )  # fmt: skip
    choice = out["choices"][0]
    assert out["usage"]["completion_tokens"] <= 3
    lp = choice["logprobs"]
    assert lp is not None and len(lp["tokens"]) == out["usage"]["completion_tokens"]
    assert all(len(alts) <= 3 for alts in lp["top_logprobs"])  # the sampled token and up to 2 others


def test_chat_sampling_fields_accepted(real_stack: Any) -> None:
    out = chat(
        real_stack, max_completion_tokens=3, temperature=0.7, top_p=0.9, top_k=20, seed=7, stop=["\n\n"], n=1,
        logprobs=True, top_logprobs=2, presence_penalty=0.5, frequency_penalty=0.5,
    )  # fmt: skip
    assert out["usage"]["completion_tokens"] <= 3
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 2 for c in content)


@pytest.mark.parametrize("n", [1, 5])
def test_max_tokens_bounds_length(real_stack: Any, n: int) -> None:
    out = completion(real_stack, max_tokens=n, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == n
    assert out["choices"][0]["finish_reason"] == "length"


def test_max_completion_tokens_bounds_chat(real_stack: Any) -> None:
    out = chat(real_stack, max_completion_tokens=2, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 2


def test_seed_is_reproducible(real_stack: Any) -> None:
    a = completion(real_stack, max_tokens=5, temperature=1.0, seed=1234, ignore_eos=True)
    b = completion(real_stack, max_tokens=5, temperature=1.0, seed=1234, ignore_eos=True)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_min_tokens_with_ignore_eos(real_stack: Any) -> None:
    # The prefill hop drops min_tokens (xpyd_router.handoff.nixl.DECODE_ONLY): kept there with max_tokens=1, vLLM
    # answers 400 "min_tokens must be less than or equal to max_tokens=1".
    out = completion(real_stack, max_tokens=6, min_tokens=4, ignore_eos=True)
    assert out["usage"]["completion_tokens"] >= 4


def test_nixl_transfer_per_request(real_stack: Any) -> None:
    """Each P/D request makes the decode engine read the prompt's KV from the prefill engine once over NIXL."""

    def count() -> float:
        return metric_sum(scrape(real_stack.decode), realvllm.NIXL_XFER_COUNT)

    def settled() -> float:
        """The decode engine's transfer count once earlier transfers are in it. Their stats ride the output of a
        later engine step, so a local request (no KV handoff, no transfer of its own) makes one; then the count
        must hold still for a second."""
        r = httpx.post(real_stack.decode + "/v1/completions", timeout=TIMEOUT,
                       json={"model": real_stack.model, "prompt": "flush", "max_tokens": 1})  # fmt: skip
        assert r.status_code == 200, r.text[:500]
        last = count()
        for _ in range(40):
            time.sleep(1.0)
            if (now := count()) == last:
                return now
            last = now
        raise AssertionError(f"{realvllm.NIXL_XFER_COUNT} still moving: {last}")

    def handoffs() -> float:
        return metric_sum(scrape(real_stack.router), "xpyd_router_kv_handoffs_total")

    def warmups() -> float:
        """The router's warm-up handoffs, once none is in flight: a worker back from a slow spell is warmed
        again, and that transfer is the engine's too."""
        assert wait_for(lambda: metric_sum(scrape(real_stack.router), "xpyd_router_pair_warmups_running") == 0, 60)
        return metric_sum(scrape(real_stack.router), "xpyd_router_pair_warmups_total")

    failed = metric_sum(scrape(real_stack.decode), "vllm:nixl_num_failed_transfers_total")
    for i in range(2):
        warm, before, hops = warmups(), settled(), handoffs()
        completion(real_stack, prompt=f"{i} {LONG_PROMPT} request {time.time_ns()}", max_tokens=2)
        assert wait_for(lambda b=before: count() > b, timeout=15.0), "no NIXL transfer counted"
        after = settled()
        extra = warmups() - warm  # after the count settled: a warm-up it holds is in here too
        moved = f"{realvllm.NIXL_XFER_COUNT}: {before} -> {after} after one P/D request and {extra:g} warm-ups"
        assert before + 1 <= after <= before + 1 + extra, moved
        assert handoffs() == hops + 1
    assert metric_sum(scrape(real_stack.decode), "vllm:nixl_num_failed_transfers_total") == failed


def test_router_index_gets_kv_events(real_stack: Any) -> None:
    """Both engines' KV events reach the router (one --kv-events-port on each engine's own address) and apply."""
    completion(real_stack, prompt=f"{LONG_PROMPT} events {time.time_ns()}", max_tokens=2)
    workers = {real_stack.prefill, real_stack.decode}

    def heard() -> dict[str, float]:
        page = scrape(real_stack.router)
        got = {w: metric_sum(page, "xpyd_router_kv_event_blocks_total", worker=w, outcome="stored") for w in workers}
        return got if all(got.values()) else {}

    assert wait_for(heard, timeout=20.0), f"no stored blocks from every engine:\n{router_kv_lines(real_stack)}"
    page = scrape(real_stack.router)
    for w in workers:
        assert metric_sum(page, "xpyd_router_kv_event_batches_total", worker=w) > 0, router_kv_lines(real_stack)
        assert metric_sum(page, "xpyd_router_kv_event_blocks_total", worker=w, outcome="mismatched") == 0, (
            router_kv_lines(real_stack)
        )


def router_kv_lines(stack: Any) -> str:
    return "\n".join(line for line in scrape(stack.router).splitlines() if "kv_event" in line or "handoff" in line)


def test_a_handoff_whose_kv_cannot_be_read_is_refused_with_a_500(real_stack: Any) -> None:
    """The engine's answer the router's retry is built on (xpyd_router.hops.Hops.pair_failed): told to read a
    prompt's KV from a prefill engine that is gone (here: a side channel nobody listens on, as when a prefill
    pod left before decode read it), vLLM's decode answers HTTP 500 (kv_load_failure_policy "fail", its
    default); the same request without the KV params, as the router retries it, is answered."""
    body = {"model": real_stack.model, "prompt": f"{LONG_PROMPT} gone {time.time_ns()}", "max_tokens": 2}
    hop = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    r = httpx.post(real_stack.prefill + "/v1/completions", json=hop, timeout=TIMEOUT)
    assert r.status_code == 200, r.text[:500]
    params = r.json()["kv_transfer_params"]
    with socket.socket() as s:  # a port with no listener on the prefill engine's address
        s.bind((params["remote_host"], 0))
        closed = int(s.getsockname()[1])
    gone = {**params, "remote_engine_id": f"gone-{time.time_ns()}", "remote_port": closed}
    refused = httpx.post(real_stack.decode + "/v1/completions", json={**body, "kv_transfer_params": gone},
                         timeout=TIMEOUT)  # fmt: skip
    assert refused.status_code == 500, refused.text[:500]
    direct = httpx.post(real_stack.decode + "/v1/completions", json=body, timeout=TIMEOUT)
    assert direct.status_code == 200 and direct.json()["usage"]["completion_tokens"] >= 1, direct.text[:500]
