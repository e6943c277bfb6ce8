"""One emulated vLLM engine: model and GPU from the catalog, block pool, engine loop, KV leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from functools import partial
from typing import Any

import aiohttp

from xpyd_emulator.bootstrap import RoomTable, wait_room
from xpyd_emulator.cmdline import EmulatorConfig
from xpyd_emulator.engine import Engine, Sequence
from xpyd_emulator.kvtransfer import LeaseTable, pull_blocks
from xpyd_emulator.metrics import EngineMetrics
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.protocol import ApiError, ParsedRequest
from xpyd_perf import (
    UnknownModelError,
    handoff_lanes,
    handoff_seconds,
    kv_bytes,
    path_between,
    resolve_gpu,
    resolve_model,
)

log = logging.getLogger("xpyd.emulator")
FALLBACK_MODEL = "llama-3.1-8b"


def gpu_blocks(cfg: EmulatorConfig, weight_bytes: float, kv_bytes_per_token: int, hbm_bytes: float) -> int:
    """KV blocks in the HBM left after weights, as vLLM sizes its cache (or the override)."""
    if cfg.num_gpu_blocks_override:
        return cfg.num_gpu_blocks_override
    free = cfg.tp * hbm_bytes * cfg.gpu_memory_utilization - weight_bytes
    return max(16, int(free // (kv_bytes_per_token * cfg.block_size)))


class Worker:
    """State shared by the HTTP handlers of one emulator process."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.cfg = cfg
        try:
            self.spec = resolve_model(cfg.model)
        except UnknownModelError:
            log.warning("model %r is not in the catalog; timing it as %s", cfg.model, FALLBACK_MODEL)
            self.spec = resolve_model(FALLBACK_MODEL)
        self.gpu = resolve_gpu(cfg.gpu)
        blocks = gpu_blocks(cfg, self.spec.weight_bytes, self.spec.kv_bytes_per_token, self.gpu.hbm_bytes)
        self.max_model_len = min(cfg.max_model_len or self.spec.max_model_len, blocks * cfg.block_size)
        self.pool = BlockPool(blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.metrics = EngineMetrics(cfg.served_model_names[0], cfg.block_size, blocks)
        self.engine = Engine(
            self.spec, self.gpu, cfg.tp, self.pool, self.metrics, speedup=cfg.speedup,
            max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
        )  # fmt: skip
        self.engine_id = str(uuid.uuid4())
        self.leases = LeaseTable(self.pool, self.engine_id, cfg.kv_lease_seconds)
        self.rooms = RoomTable(cfg.kv_lease_seconds)
        self.bootstrap_server = cfg.engine == "sglang" and cfg.disaggregation_mode == "prefill"
        self.connector = cfg.kv_transfer_config is not None
        self.inflight = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.engine.run()),
            asyncio.create_task(self._expire_forever()),
        ]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def _expire_forever(self, period: float = 1.0) -> None:
        """Frees expired KV leases (NIXL) and bootstrap rooms (SGLang) once per period."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            self.leases.expire(loop.time())
            self.rooms.expire(loop.time())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    async def admit(self, req: ParsedRequest) -> Sequence:
        """Start a request: fetch remote KV first for a disaggregated decode, then schedule it."""
        now = asyncio.get_running_loop().time()
        if req.prompt_tokens + req.max_tokens > self.pool.num_blocks * self.pool.block_size:
            raise ApiError(f"request needs more KV blocks than this engine has ({self.pool.num_blocks}).")
        kv = req.kv_transfer_params if self.connector else None
        mode = self.cfg.disaggregation_mode if self.cfg.engine == "sglang" else None
        if kv and kv.get("do_remote_prefill"):
            seq = await self._remote_prefill(req, kv, now)
        elif mode == "decode" and req.bootstrap:
            seq = await self._remote_prefill(req, None, now)
        else:
            hold = bool(kv and kv.get("do_remote_decode"))
            seq = Sequence(req.prompt_tokens, req.hashes, req.max_tokens, now, hold=hold, streamed=req.stream)
            if mode == "prefill" and req.bootstrap:
                seq.max_tokens = 1
                seq.on_done = partial(self._publish_room, req.bootstrap[2], seq)
        if self.cfg.zero_delay:
            self.engine.instant(seq, now)
        else:
            self.engine.submit(seq)
        return seq

    def _placement(self) -> dict[str, Any]:
        return {"tp_size": self.cfg.tp, "xpyd_nvlink_domain": self.cfg.nvlink_domain,
                "xpyd_node_name": self.cfg.node_name, "xpyd_gpu": self.gpu.name}  # fmt: skip

    def _publish_room(self, room: int, seq: Sequence) -> None:
        info = dict(self._placement(), tokens=seq.prompt)
        self.rooms.publish(room, info, asyncio.get_running_loop().time())

    async def _remote_prefill(self, req: ParsedRequest, kv: dict[str, Any] | None, now: float) -> Sequence:
        """Fetch the prompt's KV from its prefill worker (Nixl pull or SGLang room), model the handoff."""
        assert self._session is not None
        hits = self.pool.match(req.hashes)
        local = min(hits * self.pool.block_size, req.prompt_tokens - 1)
        if kv is not None:
            await pull_blocks(self._session, kv)
            remote = kv
        else:
            assert req.bootstrap is not None
            host, port, room = req.bootstrap
            remote = await wait_room(self._session, host, port, room, self.cfg.kv_lease_seconds)
        domain = remote.get("xpyd_nvlink_domain")
        same_node = bool(self.cfg.node_name) and remote.get("xpyd_node_name") == self.cfg.node_name
        path = "NVLink" if same_node else path_between(domain if isinstance(domain, str) else None,
                                                       self.cfg.nvlink_domain)  # fmt: skip
        remote_tp = remote.get("tp_size")
        prefill_tp = remote_tp if isinstance(remote_tp, int) else self.cfg.tp
        lanes = handoff_lanes(self.spec, prefill_tp, self.cfg.tp, self.cfg.dp_attention)
        seconds = handoff_seconds(kv_bytes(self.spec, req.prompt_tokens - local), path, self.gpu, lanes)
        if not self.cfg.zero_delay:
            await asyncio.sleep(seconds / self.cfg.speedup)
        self.metrics.prefix_queries += req.prompt_tokens
        self.metrics.prefix_hits += local
        seq = Sequence(
            req.prompt_tokens, req.hashes, req.max_tokens, now, computed=req.prompt_tokens - 1, streamed=req.stream
        )
        seq.cached = local
        return seq

    def kv_params(self, req: ParsedRequest, seq: Sequence) -> dict[str, Any] | None:
        """The kv_transfer_params a remote-decode prefill returns (its blocks now under a lease)."""
        if not seq.hold:
            return None
        ids = self.leases.grant(seq.blocks, seq.prompt, asyncio.get_running_loop().time())
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": ids,
            "remote_host": self.cfg.side_channel_host,
            "remote_port": self.cfg.side_channel_port,
            **self._placement(),
        }
