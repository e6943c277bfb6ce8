"""A vLLM data-parallel replica rank by rank: which rank serves a request, per-rank caches, limits and metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from emu_harness import KV_CONFIG, free_port, make_config, serving  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families

from xpyd_emulator.cmdline import parse_engine_command
from xpyd_emulator.dp_routing import HEADER, check_rank, header_rank, least_loaded
from xpyd_emulator.engine import Engine, Sequence
from xpyd_emulator.errors import ApiError
from xpyd_emulator.kv_events import KvEventsConfig, offset_endpoint
from xpyd_emulator.member import hosted_ranks, start_relay
from xpyd_emulator.metrics import EngineMetrics
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.worker import Worker
from xpyd_perf import GPUS, resolve_model

HOST = "127.0.0.1"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = "a prompt that spans several KV blocks " * 12  # 456 chars: 114 tokens, 7 full blocks of 16


@pytest.mark.parametrize(
    ("value", "rank"),
    [("3", 3), (" 2 ", 2), ("-1", -1), ("x", None), ("1.5", None), ("", None), (None, None)],
)
def test_the_header_is_read_as_vllm_reads_it(value: str | None, rank: int | None) -> None:
    assert header_rank({} if value is None else {HEADER.lower(): value}) == rank


def test_a_rank_out_of_range_is_vllms_400() -> None:
    assert check_rank(3, 4) == 3
    for bad in (4, -1):
        with pytest.raises(ApiError) as info:
            check_rank(bad, 4)
        assert (info.value.status, info.value.message) == (400, f"data_parallel_rank {bad} is out of range [0, 4).")


@pytest.mark.parametrize(
    ("waiting", "running", "rank"),
    [
        ([0, 0, 0], [0, 0, 0], 0),  # all idle: the first
        ([1, 0, 0], [0, 0, 0], 1),
        ([0, 0, 0], [5, 3, 3], 1),  # the first of the lowest
        ([1, 0, 0], [0, 5, 5], 0),  # 1 waiting (score 4) beats 5 running
        ([1, 0, 0], [0, 5, 3], 2),
        ([0, 1, 0], [3, 0, 4], 0),  # 3 < 4 = 4
        ([2, 1, 1], [0, 0, 0], 1),
    ],
)
def test_vllms_load_balancer_scores_waiting_four_times_running(waiting: list[int], running: list[int],
                                                               rank: int) -> None:  # fmt: skip
    assert least_loaded(waiting, running) == rank


def test_each_rank_has_its_own_prefix_index_blocks_and_events() -> None:
    pool = BlockPool(8, 16, ranks=2)
    assert (pool.num_blocks, pool.rank_blocks) == (8, 4)
    pool.record_events()
    pool.insert([1, 2, 3], rank=0)
    assert pool.match([1, 2, 3], rank=1) == 0  # cached on rank 0 only
    assert pool.match([1, 2, 3], rank=0) == 3
    pool.insert([7, 8, 9, 10, 11], rank=1)  # rank 1 holds 4: it evicts its own LRU, never rank 0's blocks
    assert pool.match([1, 2, 3], rank=0) == 3
    assert (pool.cached(0), pool.cached(1), len(pool)) == (3, 4, 7)
    assert pool.take_events(0) == [("stored", [1, 2, 3], None, [])]
    stored, *removed = pool.take_events(1)
    assert stored == ("stored", [7, 8, 9, 10, 11], None, [])
    assert removed == [("removed", [11])]  # the tail: inserted head last, so most recently used
    assert pool.take_events(0) == pool.take_events(1) == []
    assert pool.try_pin(4, rank=0) and not pool.try_pin(1, rank=0) and pool.try_pin(4, rank=1)
    pool.unpin(2, rank=1)
    assert (pool.pinned, pool.rank_usage(0), pool.rank_usage(1), pool.usage) == (6, 1.0, 0.5, 0.75)
    pool.reset()
    assert len(pool) == 0 and pool.take_events(0) == pool.take_events(1) == [("cleared",)]


def test_endpoints_are_offset_per_rank_as_vllm_offsets_them() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://10.0.0.1:6000", 2) == "tcp://10.0.0.1:6002"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    with pytest.raises(ValueError, match="tcp or inproc"):
        offset_endpoint("ipc:///tmp/kv", 1)
    config = KvEventsConfig("tcp://*:5557", "tcp://*:5600", topic="t")
    assert config.for_rank(0) is config
    assert config.for_rank(5) == KvEventsConfig("tcp://*:5562", "tcp://*:5605", topic="t")


def _engine(ranks: int, blocks: int) -> Engine:
    metrics = [EngineMetrics("m", 16, blocks // ranks, r) for r in range(ranks)]
    return Engine(resolve_model("llama-3.1-8b"), GPUS["B200"], 1, BlockPool(blocks, 16, ranks=ranks), metrics,
                  max_num_batched_tokens=4096 * ranks, max_num_seqs=4 * ranks, rank_budget=4096,
                  rank_max_seqs=4)  # fmt: skip


async def test_a_rank_out_of_blocks_waits_while_the_others_admit() -> None:
    engine = _engine(2, 40)  # 20 blocks a rank
    big, stuck, other = Sequence(300, [], 4, 0.0), Sequence(64, [], 4, 0.0), Sequence(64, [], 4, 0.0, rank=1)
    for seq in (big, stuck, other):  # 19 blocks, then 5 more on rank 0; 5 on rank 1
        engine.submit(seq)
    assert engine.waiting_on == [2, 1] and engine.pick_rank() == 1
    _, chunks, _ = engine.schedule(0.0)
    assert [seq for seq, _ in chunks] == [big, other]  # rank 0's second waits for blocks; rank 1 goes on
    assert (engine.running_on, engine.waiting_on) == ([1, 1], [1, 0])
    assert (engine.pool.pinned_on(0), engine.pool.pinned_on(1)) == (19, 5)
    engine.gauges()
    assert [(m.running, m.waiting) for m in engine.rank_metrics] == [(1, 1), (1, 0)]
    assert engine.pick_rank() == 1  # rank 0: 1 waiting (4) + 1 running; rank 1: 1 running


async def test_each_rank_has_its_own_token_budget_and_sequence_cap() -> None:
    engine = _engine(2, 100_000)
    for _ in range(6):
        engine.submit(Sequence(3000, [], 4, 0.0))  # all on rank 0
    engine.submit(Sequence(3000, [], 4, 0.0, rank=1))
    _, chunks, _ = engine.schedule(0.0)
    assert [(seq.rank, n) for seq, n in chunks] == [(0, 3000), (0, 1096), (1, 3000)]  # 4096 tokens a rank
    engine.apply([], chunks, 0.1)
    engine.pulling[1] = 3  # decodes of rank 1 fetching KV count as its waiting
    engine.gauges()
    assert [(m.running, m.waiting) for m in engine.rank_metrics] == [(2, 4), (1, 3)]
    small = _engine(2, 100_000)
    for _ in range(6):
        small.submit(Sequence(100, [], 4, 0.0))
    small.submit(Sequence(100, [], 4, 0.0, rank=1))
    _, chunks, _ = small.schedule(0.0)
    assert [seq.rank for seq, _ in chunks] == [0, 0, 0, 0, 1]  # --max-num-seqs 4 on rank 0; rank 1 goes on
    assert small.waiting_on == [2, 0]


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], rank: str | None = None,
                chat: bool = False) -> tuple[int, Any]:  # fmt: skip
    headers = {} if rank is None else {HEADER: rank}
    async with http.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body,
                         headers=headers) as resp:  # fmt: skip
        return resp.status, await resp.json()


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, engine label) -> value."""
    return {(s.name, s.labels.get("engine", "")): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if "le" not in s.labels and "finished_reason" not in s.labels}  # fmt: skip


def _worker(*args: str, **fields: Any) -> Worker:
    # --num-gpu-blocks-override counts one rank's blocks, as vLLM applies it in each engine core
    return Worker(make_config(HOST, MODEL, "--num-gpu-blocks-override", "1000", *args, **fields))


async def test_the_header_picks_the_rank_and_caches_are_per_rank() -> None:
    worker = _worker("-dp", "4", zero_delay=True)
    body = {"prompt": PROMPT, "max_tokens": 2}
    async with serving(worker) as base, aiohttp.ClientSession() as http:
        cached = []
        for rank in ("2", "2", "1", "2"):
            status, doc = await _post(http, base, body, rank)
            assert status == 200, doc
            cached.append(doc["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached == [0, 112, 0, 112]  # cached on rank 2, a miss on rank 1
        async with http.get(base + "/metrics") as resp:
            found = _samples(await resp.text())
    assert [found["vllm:prompt_tokens_total", str(r)] for r in range(4)] == [0, 114, 342, 0]
    assert [found["vllm:prefix_cache_hits_total", str(r)] for r in range(4)] == [0, 0, 224, 0]
    assert [m.success["length"] for m in worker.rank_metrics] == [0, 1, 3, 0]
    assert (worker.pool.cached(1), worker.pool.cached(2), worker.pool.cached(0)) == (7, 7, 0)


async def test_out_of_range_ranks_are_400_on_every_route_and_bad_headers_are_ignored() -> None:
    worker = _worker("-dp", "4", zero_delay=True)
    async with serving(worker) as base, aiohttp.ClientSession() as http:
        for chat, body in ((False, {"prompt": PROMPT, "max_tokens": 2}),
                           (True, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
                           (False, {"prompt": PROMPT, "max_tokens": 2, "stream": True})):  # fmt: skip
            for rank in ("4", "-1"):
                status, doc = await _post(http, base, body, rank, chat=chat)
                assert status == 400
                assert doc == {"error": {"message": f"data_parallel_rank {rank} is out of range [0, 4).",
                                         "type": "BadRequestError", "param": None, "code": 400}}  # fmt: skip
        status, _ = await _post(http, base, {"prompt": PROMPT, "max_tokens": 2}, "two")
        assert status == 200  # not an integer: vLLM ignores it, the load balancer picks rank 0 (all idle)
    assert worker.rank_metrics[0].prompt_tokens == 114
    assert sum(m.prompt_tokens for m in worker.rank_metrics) == 114


async def test_one_engine_and_sglang_ignore_the_header() -> None:
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(free_port(HOST)),
           "--tp", "4", "--dp-size", "4", "--enable-dp-attention", "--enable-metrics"]  # fmt: skip
    sglang = Worker(parse_engine_command(cmd, {"XPYD_BIND_HOST": HOST}, zero_delay=True))
    for worker, label in ((_worker(zero_delay=True), "engine"), (sglang, "tp_rank")):  # SGLang's own labels
        async with serving(worker) as base, aiohttp.ClientSession() as http:
            status, doc = await _post(http, base, {"prompt": PROMPT, "max_tokens": 2}, "7")
            assert status == 200, doc
            async with http.get(base + "/metrics") as resp:
                engines = {s.labels[label] for f in text_string_to_metric_families(await resp.text())
                           for s in f.samples}  # fmt: skip
        assert worker.ranks == 1 and worker.metrics.prompt_tokens == 114 and engines == {"0"}


async def test_metrics_report_every_rank_as_an_engine() -> None:
    worker = _worker("-dp", "4")  # timed (speedup 50): requests stay running for a while
    async with serving(worker) as base, aiohttp.ClientSession() as http:
        body = {"prompt": PROMPT, "max_tokens": 400}
        tasks = [asyncio.create_task(_post(http, base, body, rank)) for rank in ("3", "3", "1")]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while loop.time() < deadline:  # until all three run (the gauges come from the queues)
            async with http.get(base + "/metrics") as resp:
                found = _samples(await resp.text())
            if found["vllm:num_requests_running", "3"] == 2 and found["vllm:num_requests_running", "1"] == 1:
                break
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [found["vllm:num_requests_running", str(r)] for r in range(4)] == [0, 1, 0, 2]
    assert [found["vllm:num_requests_waiting", str(r)] for r in range(4)] == [0, 0, 0, 0]
    blocks = worker.pool.blocks_for(114 + 400)  # a sequence reserves prompt + max_tokens on its rank
    usage = [found["vllm:kv_cache_usage_perc", str(r)] for r in range(4)]
    assert usage == [0.0, pytest.approx(blocks / 1000), 0.0, pytest.approx(2 * blocks / 1000)]
    assert [found["vllm:cache_config_info", str(r)] for r in range(4)] == [1.0] * 4
    families = {f.name: f for f in text_string_to_metric_families(worker.render_metrics())}
    info = {s.labels["engine"]: s.labels["num_gpu_blocks"] for s in families["vllm:cache_config_info"].samples}
    assert info == {"0": "1000", "1": "1000", "2": "1000", "3": "1000"}  # one rank's cache each


async def test_a_disaggregated_pair_keeps_the_prefills_blocks_on_its_rank() -> None:
    prefill = _worker("-dp", "2", "--kv-transfer-config", KV_CONFIG, zero_delay=True)
    decode = _worker("-dp", "2", "--kv-transfer-config", KV_CONFIG, zero_delay=True)
    hop = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
           "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
    async with serving(prefill) as p_base, serving(decode) as d_base, aiohttp.ClientSession() as http:
        status, doc = await _post(http, p_base, {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": hop}, "1")
        assert status == 200, doc
        assert (prefill.pool.pinned_on(0), prefill.pool.pinned_on(1)) == (0, 8)  # the lease holds rank 1's
        assert (prefill.pool.cached(0), prefill.pool.cached(1)) == (0, 7)
        kv = doc["kv_transfer_params"]
        status, doc = await _post(http, d_base, {"prompt": PROMPT, "max_tokens": 3, "kv_transfer_params": kv}, "0")
        assert status == 200, doc
        assert prefill.pool.pinned == 0 and len(prefill.leases) == 0  # pulled: rank 1's blocks freed
        assert (decode.pool.cached(0), decode.pool.cached(1)) == (7, 0)
        assert decode.rank_metrics[0].generation_tokens == 3 and decode.rank_metrics[1].generation_tokens == 0


@pytest.mark.parametrize(
    ("flags", "ranks"),
    [
        ("-dp 8 -dpl 2 --headless --data-parallel-start-rank 4", range(4, 6)),
        ("-dp 8 -dpl 4", range(0, 4)),  # the leader's own
        ("-tp 8 --nnodes 2 --node-rank 1 --headless --master-addr 127.0.0.1", range(0)),  # one engine: no DP ranks
    ],
)
def test_a_pod_hosts_its_local_ranks_and_relays_nothing_on_the_leaders_address(flags: str, ranks: range) -> None:
    events = '{"enable_kv_cache_events":true}'
    cmd = ["vllm", "serve", MODEL, *flags.split(), "--data-parallel-address", HOST, "--kv-events-config", events]
    cfg = parse_engine_command(cmd, {"XPYD_BIND_HOST": HOST})
    assert hosted_ranks(cfg) == ranks
    assert start_relay(cfg, {}) is None  # the leader is on this address: its sockets already answer here
