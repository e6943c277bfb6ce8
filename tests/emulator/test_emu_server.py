"""The emulator over HTTP: OpenAI routes, SSE, metrics, errors, prefix caching and the two-hop protocol."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from emu_harness import KV_CONFIG, free_port, make_config, running  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families

from xpyd_emulator.cmdline import EmulatorConfig, parse_engine_command

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, data=orjson.dumps(body) if not isinstance(body, bytes) else body) as resp:
        return resp.status, orjson.loads(await resp.read())


def sse_events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"data: [DONE]\n\n")
    parts = [p for p in raw.split(b"\n\n") if p]
    assert all(p.startswith(b"data: ") for p in parts)
    return [orjson.loads(p[6:]) for p in parts[:-1]]


async def test_models_completion_chat_and_health(http: aiohttp.ClientSession) -> None:
    async with running(make_config("127.0.0.2")) as base:
        async with http.get(base + "/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == MODEL
        status, doc = await post(
            http, base + "/v1/completions", {"model": MODEL, "prompt": "hello " * 20, "max_tokens": 5}
        )
        assert status == 200
        assert doc["object"] == "text_completion"
        assert doc["choices"][0]["finish_reason"] == "length"
        assert doc["usage"]["completion_tokens"] == 5
        assert doc["usage"]["prompt_tokens"] == 30
        assert len(doc["choices"][0]["text"]) == 20
        status, chat = await post(
            http, base + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        )
        assert status == 200
        assert chat["object"] == "chat.completion"
        assert chat["choices"][0]["message"]["role"] == "assistant"
        async with http.get(base + "/health") as resp:
            assert resp.status == 200


async def test_streaming_matches_vllm_sse(http: aiohttp.ClientSession) -> None:
    async with running(make_config("127.0.0.2")) as base:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with http.post(base + "/v1/chat/completions", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = sse_events(await resp.read())
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        content = [e for e in events if e["choices"] and "content" in e["choices"][0]["delta"]][1:]
        assert len(content) == 4
        assert [e["choices"][0]["finish_reason"] for e in content] == [None, None, None, "length"]
        assert events[-1]["choices"] == []
        assert events[-1]["usage"]["completion_tokens"] == 4
        async with http.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}) as resp:
            plain = sse_events(await resp.read())
        assert [e["object"] for e in plain] == ["text_completion"] * 3  # no usage chunk unless asked
        assert all("usage" not in e for e in plain)


async def test_errors_never_crash_the_server(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.2", MODEL, "--max-model-len", "2048", "--kv-transfer-config", KV_CONFIG)
    async with running(cfg) as base:
        cases = [
            (b"{not json", 400), ({"model": "nope", "prompt": "x"}, 404),
            ({"prompt": "word " * 3000, "max_tokens": 10}, 400), ({"prompt": "x", "max_tokens": -1}, 400),
            ({"prompt": "x", "kv_transfer_params": {"do_remote_prefill": True}}, 400),
        ]  # fmt: skip
        for body, expected in cases:
            status, doc = await post(http, base + "/v1/completions", body)
            assert status == expected, doc
            assert doc["error"]["code"] == expected
        async with http.get(base + "/v1/nothing") as resp:
            assert resp.status == 404
        status, _ = await post(http, base + "/v1/completions", {"prompt": "still alive", "max_tokens": 1})
        assert status == 200


async def test_metrics_parse_and_count_prefix_hits(http: aiohttp.ClientSession) -> None:
    async with running(make_config("127.0.0.2")) as base:
        prompt = "shared system prompt " * 40
        _, first = await post(http, base + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        _, second = await post(http, base + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 208  # 13 full 16-token blocks
        async with http.get(base + "/metrics") as resp:
            families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
        hits = families["vllm:prefix_cache_hits"].samples[0]
        assert hits.value == 208
        assert hits.labels["model_name"] == MODEL
        assert families["vllm:num_requests_waiting"].samples[0].value == 0
        assert "num_gpu_blocks" in families["vllm:cache_config_info"].samples[0].labels


async def _ttft(http: aiohttp.ClientSession, url: str, prompt: str) -> float:
    start = time.perf_counter()
    status, _ = await post(http, url, {"prompt": prompt, "max_tokens": 1})
    assert status == 200
    return time.perf_counter() - start


async def test_repeated_prefix_shortens_ttft(http: aiohttp.ClientSession) -> None:
    # 70B on one H100-class replica: a 24k-token prefill is modelled at ~2.7 s; at speed-up 10 the
    # first request takes ~0.27 s and the repeat (all but the last token cached) ~1 ms of model time.
    cfg = make_config("127.0.0.2", "meta-llama/Llama-3.1-70B-Instruct", "-tp", "8", speedup=10.0, gpu="H100")
    async with running(cfg) as base:
        prompt = "abcd" * 24_000
        cold = await _ttft(http, base + "/v1/completions", prompt)
        warm = await _ttft(http, base + "/v1/completions", prompt)
        assert warm < cold / 3


async def test_overload_shows_as_waiting_requests(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.2", MODEL, "--max-num-seqs", "2", speedup=4.0)
    async with running(cfg) as base:
        body = {"prompt": "x", "max_tokens": 100}
        tasks = [asyncio.create_task(post(http, base + "/v1/completions", body)) for _ in range(6)]
        waiting = 0.0
        for _ in range(100):
            await asyncio.sleep(0.01)
            async with http.get(base + "/metrics") as resp:
                families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
            waiting = max(waiting, families["vllm:num_requests_waiting"].samples[0].value)
            if waiting >= 4:
                break
        assert waiting >= 4
        assert all(status == 200 for status, _ in await asyncio.gather(*tasks))


async def test_prefill_decode_two_hop(http: aiohttp.ClientSession) -> None:
    p_cfg = make_config(
        "127.0.0.2", MODEL, "--kv-transfer-config", KV_CONFIG, nvlink_domain="node-a", node_name="node-a"
    )
    d_cfg = make_config(
        "127.0.0.3", MODEL, "--kv-transfer-config", KV_CONFIG, nvlink_domain="node-b", node_name="node-b"
    )
    async with running(p_cfg) as prefill, running(d_cfg) as decode:
        request = {"model": MODEL, "prompt": "long shared context " * 200, "max_tokens": 6}
        hop1 = dict(request, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None})  # fmt: skip
        status, first = await post(http, prefill + "/v1/completions", hop1)
        assert status == 200
        kv = first["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True
        assert kv["remote_host"] == "127.0.0.2"
        assert kv["remote_port"] == p_cfg.side_channel_port
        assert len(kv["remote_block_ids"]) == (1000 + 15) // 16
        assert kv["xpyd_nvlink_domain"] == "node-a"
        hop2 = dict(request, stream=True, stream_options={"include_usage": True}, kv_transfer_params=kv)
        async with http.post(decode + "/v1/completions", json=hop2) as resp:
            assert resp.status == 200
            events = sse_events(await resp.read())
        assert events[-1]["usage"]["completion_tokens"] == 6
        status, again = await post(http, decode + "/v1/completions", dict(request, kv_transfer_params=kv))
        assert status == 500  # the lease was released by the first pull
        assert "unknown or their lease expired" in again["error"]["message"]
        forged = dict(kv, remote_engine_id="someone-else")
        status, doc = await post(http, decode + "/v1/completions", dict(request, kv_transfer_params=forged))
        assert status == 500
        assert "KV transfer" in doc["error"]["message"]


async def test_zero_delay_answers_at_once_and_keeps_accounting(http: aiohttp.ClientSession) -> None:
    cfg = replace(make_config("127.0.0.2"), zero_delay=True)
    async with running(cfg) as base:
        async with http.post(
            base + "/v1/completions", json={"prompt": "p " * 100, "max_tokens": 50, "stream": True}
        ) as resp:
            events = sse_events(await resp.read())
        assert len(events) == 50
        _, doc = await post(http, base + "/v1/completions", {"prompt": "p " * 100, "max_tokens": 50})
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 48


async def test_stop_finishes_in_flight_requests(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.2", MODEL, speedup=1.0)
    stop = asyncio.Event()
    from xpyd_emulator.server import serve

    server = asyncio.create_task(serve(cfg, stop, drain_seconds=10))
    base = f"http://{cfg.host}:{cfg.port}"
    for _ in range(200):
        try:
            async with http.get(base + "/health"):
                break
        except aiohttp.ClientError:
            await asyncio.sleep(0.01)
    inflight = asyncio.create_task(post(http, base + "/v1/completions", {"prompt": "x", "max_tokens": 100}))
    await asyncio.sleep(0.05)
    stop.set()
    status, doc = await asyncio.wait_for(inflight, 10)
    assert status == 200
    assert doc["usage"]["completion_tokens"] == 100
    await asyncio.wait_for(server, 10)


def sglang_config(host: str, mode: str, bootstrap_port: int) -> EmulatorConfig:
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(free_port(host)),
           "--tp", "1", "--disaggregation-mode", mode,
           "--disaggregation-bootstrap-port", str(bootstrap_port)]  # fmt: skip
    return replace(parse_engine_command(cmd, {"XPYD_BIND_HOST": host}, speedup=50.0), kv_lease_seconds=0.5)


async def test_sglang_bootstrap_pair(http: aiohttp.ClientSession) -> None:
    bootstrap = free_port("127.0.0.5")
    async with (
        running(sglang_config("127.0.0.5", "prefill", bootstrap)) as prefill,
        running(sglang_config("127.0.0.6", "decode", bootstrap)) as decode,
    ):
        body = {"prompt": "sglang shared prompt " * 50, "max_tokens": 5, "bootstrap_host": "127.0.0.5",
                "bootstrap_port": bootstrap, "bootstrap_room": 12345}  # fmt: skip
        (p_status, p_doc), (d_status, d_doc) = await asyncio.gather(
            post(http, prefill + "/v1/completions", body), post(http, decode + "/v1/completions", body)
        )
        assert (p_status, d_status) == (200, 200)
        assert p_doc["usage"]["completion_tokens"] == 1
        assert d_doc["usage"]["completion_tokens"] == 5
        lonely = dict(body, bootstrap_room=999)  # no prefill ever publishes this room
        status, doc = await post(http, decode + "/v1/completions", lonely)
        assert status == 500
        assert "bootstrap room 999" in doc["error"]["message"]


def _gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


async def test_client_disconnect_aborts_a_queued_request(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.41", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "1", speedup=1.0)
    async with running(cfg) as base:
        body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 3000}
        busy = asyncio.create_task(http.post(base + "/v1/completions", json=body))
        await asyncio.sleep(0.2)
        with pytest.raises(TimeoutError):  # queued behind `busy`; the client gives up
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as impatient:
                await impatient.post(base + "/v1/completions", json=body)
        for _ in range(20):  # well before `busy` (3000 tokens at real speed) could finish
            async with http.get(base + "/metrics") as resp:
                text = await resp.text()
            if _gauge(text, "vllm:num_requests_waiting") == 0:
                break
            await asyncio.sleep(0.05)
        assert _gauge(text, "vllm:num_requests_waiting") == 0
        assert _gauge(text, "vllm:num_requests_running") == 1
        busy.cancel()
