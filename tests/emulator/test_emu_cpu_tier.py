"""The emulator's CPU KV tier (vLLM's native offloading): the flags that turn it on, the block pool's
write-through tier and its LRU, reloads instead of recomputes, and the KV events vLLM's
OffloadingConnector publishes (medium CPU), read back by the router's own decoder."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from xpyd_emulator.cmdline import CommandLineError, parse_engine_command
from xpyd_emulator.engine import Engine, Sequence
from xpyd_emulator.kv_publisher import KVEventBatch, to_wire
from xpyd_emulator.metrics import EngineMetrics
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.worker import reload_bytes_per_s
from xpyd_perf import GPUS, resolve_model
from xpyd_router.kv.engine_view import EngineView
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.kv.wire import decode_batch

VLLM = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
LLAMA = resolve_model("llama-3.1-8b")  # 131,072 KV bytes per token: a 16-token block is 2 MiB


@pytest.mark.parametrize(
    ("flags", "size"),
    [
        ([], 0),
        (["--kv-offloading-size", "2"], 2 << 30),
        (["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"], 1 << 29),
        (["--kv-offloading-backend", "native"], 0),  # a backend without a size: no tier, as in vLLM
    ],
)
def test_vllms_offloading_flags_size_the_tier(flags: list[str], size: int) -> None:
    assert parse_engine_command([*VLLM, *flags], {}).kv_offloading_bytes == size


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"], "native offloading only"),
        (["--kv-offloading-size", "0"], "--kv-offloading-size"),
        (["--kv-offloading-size", "lots"], "--kv-offloading-size"),
    ],
)
def test_offloading_the_emulator_does_not_model_is_refused(flags: list[str], message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        parse_engine_command([*VLLM, *flags], {})


@pytest.mark.parametrize(
    ("gpu", "tp", "flag", "rate"),
    [
        ("B200", 1, None, 51.2e9),  # 80% of PCIe Gen5's 64 GB/s
        ("H200", 4, None, 4 * 51.2e9),  # each GPU its shard over its own link
        ("GB200", 2, None, 2 * 360e9),  # NVLink-C2C
        ("B200", 2, "10", 2 * 10e9),  # --host-link-gbps wins
    ],
)
def test_a_reload_runs_at_the_host_links_rate(gpu: str, tp: int, flag: str | None, rate: float) -> None:
    knobs = {"host_link_gbps": flag}
    cfg = parse_engine_command([*VLLM, "--tensor-parallel-size", str(tp)], {}, flags=knobs)
    assert reload_bytes_per_s(cfg, GPUS[gpu]) == pytest.approx(rate)


def _pool(gpu: int, cpu: int) -> BlockPool:
    pool = BlockPool(gpu, 16, cpu_blocks=cpu)
    pool.record_events()
    return pool


@pytest.mark.parametrize(
    ("gpu", "cpu", "prompts", "gpu_hits", "reloads", "kinds"),
    [
        # no tier: the evicted prompt is gone
        (64, 0, [[1, 2, 3, 4], [5, 6, 7, 8]], 0, 0, ["stored", "stored", "removed"]),
        # a tier with room: every cached block copied to it; the GPU's eviction leaves it there
        (64, 16, [[1, 2, 3, 4], [5, 6, 7, 8]], 0, 4, ["stored", "offloaded", "stored", "removed", "offloaded"]),
        # a tier too small for both prompts: its LRU drops the first prompt's blocks
        (64, 4, [[1, 2, 3, 4], [5, 6, 7, 8]], 0, 0, ["stored", "offloaded", "stored", "removed", "offloaded",
                                                     "unloaded"]),
    ],
)  # fmt: skip
def test_the_tier_keeps_what_the_gpu_evicts_while_it_has_room(
    gpu: int, cpu: int, prompts: list[list[int]], gpu_hits: int, reloads: int, kinds: list[str]
) -> None:
    pool = _pool(gpu, cpu)
    pool.rank_blocks = 4  # a GPU cache of one prompt (the pool's pinning budget stays apart)
    for hashes in prompts:
        pool.insert(hashes)
    assert [e[0] for e in _squash(pool.take_events())] == kinds
    first = prompts[0]
    hits = pool.match(first)
    assert (hits, pool.reload(first, hits)) == (gpu_hits, reloads)


def _squash(events: list[Any]) -> list[Any]:
    """Runs of per-block "removed" events as one (vLLM sends one BlockRemoved per evicted block)."""
    out: list[Any] = []
    for e in events:
        if out and e[0] == "removed" and out[-1][0] == "removed":
            continue
        out.append(e)
    return out


@pytest.mark.parametrize(
    ("cpu_held", "gpu_hits", "run"),
    [
        ([1, 2, 3, 4], 0, 4),
        ([3, 4], 2, 2),  # the run continues the GPU's prefix
        ([1, 3, 4], 0, 1),  # a gap ends it: block 3 is no use without block 2
        ([1, 2], 4, 0),  # nothing after a whole-prompt GPU hit
    ],
)
def test_the_reload_is_the_unbroken_cpu_run_after_the_gpu_prefix(cpu_held: list[int], gpu_hits: int, run: int) -> None:
    pool = BlockPool(64, 16, cpu_blocks=16)
    pool._cpu[0].update(dict.fromkeys(cpu_held))
    assert pool.reload([1, 2, 3, 4], gpu_hits) == run
    assert pool.offloaded(0) == len(cpu_held)


async def test_a_prompt_on_the_cpu_tier_waits_for_its_reload_and_is_not_recomputed() -> None:
    pool = BlockPool(10_000, 16, cpu_blocks=1_000)
    pool.insert(list(range(1, 65)))  # 64 blocks: 1024 tokens, on the GPU and (copied) on the CPU
    pool.rank_blocks = 1  # now a GPU cache too small to keep them: the next insert evicts all
    pool.insert([999])
    assert pool.match(list(range(1, 65))) == 0
    metrics = EngineMetrics("m", 16, 10_000)
    rate = 51.2e9
    engine = Engine(LLAMA, GPUS["B200"], 1, pool, metrics, max_num_batched_tokens=8192, reload_bytes_per_s=rate)
    pool.rank_blocks = 10_000
    seq = Sequence(1024 + 8, list(range(1, 65)), 4, 0.0)
    engine.submit(seq)
    decodes, chunks, _ = engine.schedule(0.0)
    assert not chunks and not decodes  # loading: nothing to step yet
    assert seq.reloaded == 1024 and seq.computed == 1024
    assert seq.ready_at == pytest.approx(1024 * LLAMA.kv_bytes_per_token / rate)
    assert metrics.offload_hits == 1024 and metrics.prefix_hits == 0
    _, chunks, _ = engine.schedule(seq.ready_at)
    assert [(s, n) for s, n in chunks] == [(seq, 8)]  # only the tokens after the reloaded prefix


def _wire(events: list[Any]) -> list[dict[str, Any]]:
    batch = KVEventBatch(0.0, to_wire(events, 16, per_page=False), 0)
    out: list[dict[str, Any]] = msgspec.to_builtins(batch)[1]
    return out


@pytest.mark.parametrize(
    ("event", "wire"),
    [
        (("offloaded", [7, 8]), {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
                                 "token_ids": [], "block_size": 16, "lora_id": None, "medium": "CPU",
                                 "lora_name": None}),
        (("unloaded", [7]), {"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU"}),
        (("removed", [7]), {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}),
    ],
)  # fmt: skip
def test_tier_events_go_out_as_vllms_offloading_connector_sends_them(event: tuple[Any, ...], wire: Any) -> None:
    assert _wire([event]) == [wire]


def test_the_router_reads_the_emulators_tier_events() -> None:
    pool = _pool(64, 16)
    pool.rank_blocks = 4
    tokens = list(range(128))
    pool.insert([11, 12, 13, 14], tokens)
    pool.insert([21, 22, 23, 24], tokens[64:])  # evicts the first prompt from the GPU, not from the CPU
    payload = msgspec.msgpack.encode(KVEventBatch(0.0, to_wire(pool.take_events(), 16, per_page=False), 0))
    index = PrefixIndex()
    view = EngineView("w", index, 16)
    view.apply(decode_batch(payload))
    keys = [view.blocks[h] & ((1 << 64) - 1) for h in (11, 12, 13, 14)]
    assert index.match(keys) == {}
    assert index.offloaded.run("w", keys, 0) == 4
    assert view.stats.offloaded == 8 and view.stats.orphans == 0
