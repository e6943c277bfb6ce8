"""The test of the test: the wheel oracle finds what each release is known to have, and nothing made up.

Also the KV-event wire both ways with the engines' own msgspec Structs, loaded from their wheels:
the engine encodes, the router decodes; the emulator encodes, the engine decodes.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from contract.wheels import (  # type: ignore[import-not-found]  # tests/ is on sys.path
    EngineRelease,
    cache_dir,
    facts,
    load_module,
)
from xpyd_api import engines
from xpyd_emulator.kv_publisher import KVEventBatch as EmulatorBatch
from xpyd_emulator.kv_publisher import to_wire
from xpyd_router.kv.wire import Cleared, Removed, Stored, decode_batch

pytestmark = pytest.mark.engine_wheels

VLLM = list(engines.supported_releases("vllm"))
SGLANG = list(engines.supported_releases("sglang"))
RELEASES = [EngineRelease("vllm", v) for v in VLLM] + [EngineRelease("sglang", v) for v in SGLANG]
ids = str

VLLM_FLAGS = ("--tensor-parallel-size", "--data-parallel-size", "--kv-transfer-config", "--kv-events-config",
              "--enable-expert-parallel", "--data-parallel-rpc-port", "--headless", "--port", "--host",
              "--block-size", "--load-format", "--data-parallel-size-local", "--data-parallel-address",
              "--data-parallel-start-rank", "--api-server-count", "--max-model-len",
              "--enable-prefix-caching")  # fmt: skip
SGLANG_FLAGS = ("--model-path", "--tp-size", "--dp-size", "--ep-size", "--enable-dp-attention", "--enable-metrics",
                "--kv-events-config", "--nnodes", "--node-rank", "--dist-init-addr", "--disaggregation-mode",
                "--host", "--port", "--moe-a2a-backend", "--deepep-mode", "--enable-mixed-chunk")  # fmt: skip
VLLM_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                "vllm:e2e_request_latency_seconds", "vllm:cache_config_info")  # fmt: skip
SGLANG_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                  "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds")  # fmt: skip


@pytest.mark.parametrize("release", RELEASES, ids=ids)
def test_known_names_are_found_and_made_up_ones_are_not(release: EngineRelease) -> None:
    f = facts(release)
    known_flags = VLLM_FLAGS if release.kind == "vllm" else SGLANG_FLAGS
    assert set(known_flags) <= f.flags, sorted(set(known_flags) - f.flags)
    assert "--no-such-flag-xyz" not in f.flags
    assert not any("_" in flag for flag in f.flags), "flags are normalized to dashes"
    metrics = VLLM_METRICS if release.kind == "vllm" else SGLANG_METRICS
    assert set(metrics) <= set(f.metrics), sorted(set(metrics) - set(f.metrics))
    assert f"{release.kind}:no_such_metric" not in f.metrics
    assert {"/health", "/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics"} <= f.endpoints
    assert "/no/such/route" not in f.endpoints
    if release.kind == "vllm":
        assert {"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_USE_DEEP_GEMM"} <= f.env
        assert "VLLM_NO_SUCH" not in f.env
        assert f.metrics["vllm:prompt_tokens"] == "counter"
        assert "vllm:prompt_tokens_total" in f.exposed_metrics
        assert f.metrics["vllm:time_to_first_token_seconds"] == "histogram"
        assert {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "do_remote_prefill",
                "do_remote_decode"} <= f.kv_transfer_params  # fmt: skip
        assert f.literals["KVTransferConfig.kv_role"] == ("kv_producer", "kv_both", "kv_consumer")
    else:
        assert "SGLANG_NO_SUCH" not in f.env and "SGLANG_NO_SUCH" not in f.env_read
        assert f.flag_choices["--disaggregation-mode"] == ("null", "prefill", "decode")


def test_version_differences_are_detected() -> None:
    old, new = facts(EngineRelease("vllm", "0.11.0")), facts(EngineRelease("vllm", "0.33.0"))
    assert {"VLLM_ALL2ALL_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4"} <= old.env
    assert not {"VLLM_ALL2ALL_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4"} & new.env
    assert {"--all2all-backend", "--moe-backend", "--nnodes", "--data-parallel-external-lb"} <= new.flags - old.flags
    assert "vllm:gpu_cache_usage_perc" in old.metrics and "vllm:gpu_cache_usage_perc" not in new.metrics
    assert not any(m.startswith("vllm:nixl_") for m in old.metrics)
    assert "vllm:nixl_xfer_time_seconds" in new.metrics
    assert {"kv_rank", "kv_parallel_size", "kv_ip"} <= set(old.configs["KVTransferConfig"])
    assert not {"kv_rank", "kv_parallel_size", "kv_ip"} & set(new.configs["KVTransferConfig"])
    assert "remote_request_id" in new.kv_transfer_params - old.kv_transfer_params
    assert "deepep_low_latency" in new.flag_choices["--all2all-backend"]
    assert "flashinfer_cutlass" in new.flag_choices["--moe-backend"]
    assert old.struct_options["BlockStored"]["array_like"] and not new.struct_options["BlockStored"]["array_like"]
    s_old, s_new = facts(EngineRelease("sglang", "0.5.3")), facts(EngineRelease("sglang", "0.5.23"))
    assert "--attn-dp-size" in s_new.flags - s_old.flags
    assert "--attn-dp-size" in s_new.deprecated_flags["--enable-dp-attention"]
    assert "cache_salt" in s_new.structs["BlockStored"] and "cache_salt" not in s_old.structs["BlockStored"]


def test_facts_round_trip_through_their_cache() -> None:
    """A warm run reads the JSON next to the wheel: what it holds equals what the sources say."""
    release = EngineRelease("vllm", VLLM[0])
    fresh = facts(release)
    facts.cache_clear()
    cached = sorted((cache_dir() / "facts").glob(f"vllm-{release.version}-*.json"))
    assert cached, "facts are cached as JSON keyed by the wheel's sha256"
    assert facts(release) == fresh


# --- the KV-event wire, with the engines' own Structs ---

HASHES = [11, 22, 33]
TOKENS = list(range(48))


def _engine_batch(release: EngineRelease, salt: str | None = None) -> Any:
    """One batch built with the release's own Structs: stored (3 blocks of 16), one removed, cleared."""
    mod = load_module(release, f"{release.kind}/{'distributed' if release.kind == 'vllm' else 'srt/disaggregation'}"
                               "/kv_events.py")  # fmt: skip
    stored_fields = set(facts(release).structs["BlockStored"])
    extra: dict[str, Any] = {"medium": "GPU"} if "medium" in stored_fields else {}
    if "lora_name" in stored_fields:
        extra["lora_name"] = None  # required (no default) in vLLM >= 0.32
    if salt is not None:
        extra["cache_salt"] = salt
    stored = mod.BlockStored(block_hashes=HASHES, parent_block_hash=None, token_ids=TOKENS, block_size=16,
                             lora_id=None, **extra)  # fmt: skip
    removed_kw = {"medium": "GPU"} if "medium" in facts(release).structs["BlockRemoved"] else {}
    events = [stored, mod.BlockRemoved(block_hashes=[33], **removed_kw), mod.AllBlocksCleared()]
    return mod, mod.KVEventBatch(ts=time.time(), events=events)


@pytest.mark.parametrize("release", RELEASES, ids=ids)
def test_router_decodes_what_the_engine_encodes(release: EngineRelease) -> None:
    _, batch = _engine_batch(release)
    payload = msgspec.msgpack.Encoder().encode(batch)
    assert decode_batch(payload) == [Stored(HASHES, None, TOKENS, 16), Removed([33]), Cleared()]


def test_router_reads_sglang_cache_salt() -> None:
    """SGLang 0.5.23 puts cache_salt top-level in BlockStored (a map): the router keys the run under it."""
    _, batch = _engine_batch(EngineRelease("sglang", "0.5.23"), salt="tenant-a")
    events = decode_batch(msgspec.msgpack.Encoder().encode(batch))
    assert [getattr(e, "salt", None) for e in events if isinstance(e, Stored)] == ["tenant-a"], events


# The emulator publishes the newest release's wire; the router reads every release's (above).
NEWEST = {kind: EngineRelease(kind, engines.supported_releases(kind)[0]) for kind in ("vllm", "sglang")}


@pytest.mark.parametrize("release", [NEWEST["vllm"]], ids=ids)
def test_engine_decodes_what_the_emulator_encodes(release: EngineRelease) -> None:
    mod = load_module(release, "vllm/distributed/kv_events.py")
    events = [("stored", HASHES, None, TOKENS), ("removed", [33]), ("cleared",)]
    payload = msgspec.msgpack.Encoder().encode(EmulatorBatch(1.0, to_wire(events, 16, per_page=False), 2))
    batch = msgspec.msgpack.Decoder(mod.KVEventBatch).decode(payload)
    assert batch.data_parallel_rank == 2
    stored, removed, cleared = batch.events
    got = (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size)
    assert got == (HASHES, None, TOKENS, 16)
    assert removed.block_hashes == [33]
    assert type(cleared).__name__ == "AllBlocksCleared"


@pytest.mark.parametrize("release", [NEWEST["sglang"]], ids=ids)
def test_sglang_decodes_what_the_emulator_encodes_per_page(release: EngineRelease) -> None:
    mod = load_module(release, "sglang/srt/disaggregation/kv_events.py")
    events = [("stored", HASHES, None, TOKENS), ("removed", [33])]
    payload = msgspec.msgpack.Encoder().encode(EmulatorBatch(1.0, to_wire(events, 16, per_page=True), 0))
    batch = msgspec.msgpack.Decoder(mod.KVEventBatch).decode(payload)
    assert [e.block_hashes for e in batch.events] == [[11], [22], [33], [33]]


def test_kv_events_port_offset_is_vllms() -> None:
    """The emulator's per-rank endpoint rule against vLLM's own offset_endpoint_port."""
    from xpyd_emulator.kv_events import offset_endpoint

    for v in VLLM:
        publisher = load_module(EngineRelease("vllm", v), "vllm/distributed/kv_events.py").ZmqEventPublisher
        for endpoint, rank in (("tcp://*:5557", 0), ("tcp://*:5557", 3), ("inproc://kv", 2), ("tcp://h:7000", 9)):
            assert offset_endpoint(endpoint, rank) == publisher.offset_endpoint_port(endpoint, rank), (v, endpoint)
