"""The emulator exports vLLM's NIXL transfer series on a worker with a KV connector, from its own handoffs."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from emu_harness import KV_CONFIG, make_config, serving  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families

from xpyd_api.engines import VLLM_METRICS
from xpyd_emulator.worker import Worker

pytestmark = pytest.mark.timeout(60)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFILL_HOP = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


async def _samples(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with http.get(base + "/metrics") as resp:
        text = await resp.text()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_a_decode_times_and_sizes_each_pull_and_counts_failed_ones() -> None:
    prefill = Worker(make_config("127.0.0.31", MODEL, "--kv-transfer-config", KV_CONFIG))
    decode = Worker(make_config("127.0.0.32", MODEL, "--kv-transfer-config", KV_CONFIG))
    xfer, size = VLLM_METRICS.kv_transfers, VLLM_METRICS.kv_transfer_bytes
    assert xfer and size and VLLM_METRICS.kv_transfer_failures
    async with serving(prefill) as p, serving(decode) as d, aiohttp.ClientSession() as http:
        before = await _samples(http, d)
        assert before[f"{xfer}_count"] == 0 and before[VLLM_METRICS.kv_transfer_failures] == 0
        body: dict[str, Any] = {"prompt": "abcd" * 200, "max_tokens": 1, "kv_transfer_params": PREFILL_HOP}
        async with http.post(p + "/v1/completions", json=body) as resp:
            params = (await resp.json())["kv_transfer_params"]
        second = {"prompt": "abcd" * 200, "max_tokens": 3, "kv_transfer_params": params}
        async with http.post(d + "/v1/completions", json=second) as resp:
            assert resp.status == 200
        async with http.post(d + "/v1/completions", json=second) as resp:  # the lease is gone: a failed read
            assert resp.status == 500
        after = await _samples(http, d)
        assert after[f"{xfer}_count"] == 1
        assert 0 <= after[f"{xfer}_sum"] < 5
        assert after[f"{size}_count"] == 1
        assert after[f"{size}_sum"] > 100_000  # 200 tokens of Llama-3.1-8B's KV: 128 KiB a token
        assert after[VLLM_METRICS.kv_transfer_failures] == 1


async def test_no_nixl_series_without_a_kv_connector() -> None:
    worker = Worker(make_config("127.0.0.33", MODEL))
    async with serving(worker) as base, aiohttp.ClientSession() as http:
        names = await _samples(http, base)
    assert not any(n.startswith("vllm:nixl_") for n in names)
