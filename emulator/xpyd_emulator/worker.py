"""One emulated vLLM engine: model and GPU from the catalog, block pool, engine loop, KV leases, health.

A vLLM data-parallel replica (D > 1) is modelled rank by rank where vLLM keeps ranks apart: each
request goes to one rank (its `X-data-parallel-rank` header, else vLLM's load balancer; see
dp_routing.py), which matches, caches and pins its blocks, counts it in its own metrics and
publishes its KV events on its own sockets (port + rank). The API pod of a multi-node group
publishes every rank's events, its members' too (kv_relay.py lets a member serve its own ranks).
SGLang replicas and single engines keep one rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import replace
from typing import Any

import aiohttp

from xpyd_api import handoff
from xpyd_api.engines import METRICS
from xpyd_emulator.bootstrap import RoomTable, wait_room
from xpyd_emulator.cmdline import EmulatorConfig
from xpyd_emulator.dp_routing import check_rank
from xpyd_emulator.engine import Engine, Sequence
from xpyd_emulator.errors import ApiError
from xpyd_emulator.faults import KvPullFault
from xpyd_emulator.kv_publisher import ZmqPublisher
from xpyd_emulator.kvtransfer import LeaseTable, pull_blocks
from xpyd_emulator.leader import GroupLeader
from xpyd_emulator.listener import Limits, connection_cap
from xpyd_emulator.member import identity
from xpyd_emulator.metrics import EngineMetrics, render_engines
from xpyd_emulator.parallel import domain_gpus, gpu_blocks, replica_blocks, wide
from xpyd_emulator.peers import PeerPolicy, RemoteKv, check_peer, nixl_flags, nixl_remote
from xpyd_emulator.prefix_cache import BlockPool
from xpyd_emulator.protocol import ParsedRequest
from xpyd_perf import (
    GpuSpec,
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


HOST_LINK_EFFICIENCY = (
    0.8  # the share of the host link's rate a reload of whole blocks achieves (as the router prices it)
)


def reload_bytes_per_s(cfg: EmulatorConfig, gpu: GpuSpec) -> float:
    """How fast the replica loads KV back from its CPU tier: each of its `tp` GPUs its shard over its own
    host link, at --host-link-gbps or 80% of the topology table's link (PCIe Gen5 64 GB/s on HGX,
    NVLink-C2C 450 GB/s on GB200)."""
    per_gpu = cfg.host_link_gbps * 1e9 if cfg.host_link_gbps else gpu.host_bandwidth * HOST_LINK_EFFICIENCY
    return per_gpu * max(1, cfg.tp)


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
        layout, self.wide = cfg.layout, wide(cfg)
        if self.wide:
            blocks = replica_blocks(cfg, self.spec, self.gpu.hbm_bytes)
            rank_blocks = blocks // layout.dp  # one sequence lives on one data-parallel rank
        else:
            blocks = rank_blocks = gpu_blocks(cfg, self.spec.weight_bytes, self.spec.kv_bytes_per_token,
                                              self.gpu.hbm_bytes)  # fmt: skip
        self.max_model_len = min(cfg.max_model_len or self.spec.max_model_len, rank_blocks * cfg.block_size)
        ranks = layout.dp if cfg.engine == "vllm" else 1  # vLLM's limits are per rank, SGLang's for the replica
        self.ranks = ranks  # vLLM's data-parallel engines, each with its own prefix cache and metrics
        # vLLM's native offloading: --kv-offloading-size is one engine's (one data-parallel rank's) host memory
        cpu_blocks = cfg.kv_offloading_bytes // (cfg.block_size * self.spec.kv_bytes_per_token)
        self.pool = BlockPool(blocks, cfg.block_size, cfg.enable_prefix_caching, ranks=ranks, cpu_blocks=cpu_blocks)
        name = cfg.served_model_names[0]
        self.metric_names = METRICS[cfg.engine]  # the engine's own names (xpyd_api.engines)
        labels = sglang_labels(name, cfg.disaggregation_mode) if cfg.engine == "sglang" else None
        self.rank_metrics = [
            EngineMetrics(name, cfg.block_size, self.pool.rank_blocks, r, labels, self.max_model_len)
            for r in range(ranks)
        ]
        self.metrics = self.rank_metrics[0]
        for m in self.rank_metrics:  # vLLM's NixlConnector series, with a KV connector
            m.nixl = cfg.kv_transfer_config is not None and cfg.engine == "vllm"
            m.cpu_tier = self.pool.cpu_blocks > 0
        reload_rate = reload_bytes_per_s(cfg, self.gpu) if self.pool.cpu_blocks else 0.0
        self.engine = Engine(
            self.spec, self.gpu, cfg.tp, self.pool, self.rank_metrics, speedup=cfg.speedup,
            max_num_batched_tokens=cfg.max_num_batched_tokens * ranks, max_num_seqs=cfg.max_num_seqs * ranks,
            parallel=layout.parallelism(domain_gpus(self.gpu.name)) if self.wide else None,
            rank_budget=cfg.max_num_batched_tokens // (1 if cfg.engine == "vllm" else layout.dp) or 1,
            rank_max_seqs=cfg.max_num_seqs, reload_bytes_per_s=reload_rate,
        )  # fmt: skip
        self.group: GroupLeader | None = None
        if cfg.group.multi_node:  # the leader: ranks 1..N-1 join it; it models all their GPUs
            self.group = GroupLeader(identity(cfg), cfg.host, cfg.group.leader_port, cfg.heartbeat_timeout,
                                     self._group_complete)  # fmt: skip
        self.engine_id = str(uuid.uuid4())
        self.peers = PeerPolicy.parse(cfg.kv_peers) if cfg.kv_peers else PeerPolicy.around(cfg.side_channel_host)
        self.leases = LeaseTable(self.pool, self.engine_id, cfg.kv_lease_seconds)
        self.rooms = RoomTable(cfg.kv_lease_seconds)
        self.sglang = cfg.engine == "sglang"
        self.bootstrap_server = self.sglang and cfg.disaggregation_mode == "prefill"
        self.connector = cfg.kv_transfer_config is not None
        self.facts = handoff_facts(cfg)
        self.fault = KvPullFault.from_config(cfg)  # --fault-kv-pull-*: injected KV-pull faults
        self.recompute_failed_loads = bool(
            cfg.kv_transfer_config and cfg.kv_transfer_config.get("kv_load_failure_policy") == "recompute"
        )
        # No progress for this long with work queued means the engine is wedged: leases expire
        # well before, so blocks pinned longer than that are never coming back.
        self.wedge_seconds = cfg.kv_lease_seconds + 30.0
        self.limits = Limits(cfg.header_timeout, cfg.body_timeout, cfg.max_body_bytes,
                             connection_cap(cfg.max_connections))  # fmt: skip
        self.draining = False
        self.inflight = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.kv_events: list[ZmqPublisher] = []  # one per rank, in rank order

    def _group_complete(self, domains: list[str | None]) -> None:
        """Every rank joined: time the all-to-all over the NVLink domains the ranks report."""
        layout = self.cfg.layout
        span = max(1, layout.world // len(set(domains))) if all(domains) else domain_gpus(self.gpu.name)
        self.engine.parallel = layout.parallelism(span)
        log.info("all %d ranks joined: %s", len(domains), self.engine.parallel.describe())

    async def start(self) -> None:
        if self.group is not None:  # binds the group's port first: may raise OSError
            await self.group.start()
        events = self.cfg.kv_events
        if events is not None and self.cfg.enable_prefix_caching:  # binds its ports first: may raise OSError
            try:
                for rank in range(self.ranks):  # rank r on the endpoints' ports + r, as vLLM's rank r
                    self.kv_events.append(ZmqPublisher(events, self.cfg.host, self.cfg.block_size,
                                                       per_page=self.sglang, rank=rank))  # fmt: skip
            except OSError:
                await self._close_publishers()
                raise
            self.pool.record_events()
            self.engine.on_events = self._publish
        self._tasks = [
            asyncio.create_task(self.engine.run(), name="engine"),
            asyncio.create_task(self._expire_forever(), name="lease-expiry"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)
        if self.fault is not None:
            self.fault.arm()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10, sock_connect=3))

    def _publish(self, rank: int, events: list[Any]) -> None:
        self.kv_events[rank].publish(events)

    async def _close_publishers(self) -> None:
        publishers, self.kv_events = self.kv_events, []
        for publisher in publishers:
            await asyncio.to_thread(publisher.shutdown)

    def render_metrics(self) -> str:
        """/metrics: every rank's engine, labelled engine="<rank>"."""
        self.engine.gauges()
        for rank, m in enumerate(self.rank_metrics):
            m.index_blocks = self.pool.cached(rank)
            m.offloaded_blocks = self.pool.offloaded(rank)
        return render_engines(self.rank_metrics, self.metric_names)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() and not self._tasks:
            return  # stop() cancelled it
        exc = None if task.cancelled() else task.exception()
        log.error("the %s loop stopped (%r); /health now answers 503", task.get_name(), exc)
        self.engine.fail_all()

    async def _expire_forever(self, period: float = 1.0) -> None:
        """Frees expired KV leases (NIXL) and bootstrap rooms (SGLang) once per period."""
        loop = asyncio.get_running_loop()
        period = min(period, self.cfg.kv_lease_seconds / 4)
        while True:
            await asyncio.sleep(period)
            self.leases.expire(loop.time())
            self.rooms.expire(loop.time())
            self.engine.gauges()

    async def stop(self) -> None:
        if self.fault is not None:
            self.fault.disarm()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
        if self.group is not None:
            await self.group.stop()
        if self.kv_events:
            self.engine.on_events = None
            await self._close_publishers()

    def problem(self) -> str | None:
        """Why this engine should not get traffic (None when healthy): draining, or wedged."""
        if self.draining:
            return "draining: this worker is shutting down"
        if self.group is not None and (group := self.group.problem()):
            return group
        if any(task.done() for task in self._tasks):
            return "engine loop stopped"
        if self.engine.stalled(asyncio.get_running_loop().time(), self.wedge_seconds):
            return f"engine wedged: no step for {self.wedge_seconds:g} s with requests queued"
        return None

    def busy(self) -> bool:
        """Something a draining worker must still finish: requests, leases or rooms not yet pulled."""
        return self.inflight > 0 or len(self.leases) > 0 or self.rooms.published() > 0

    def choose_rank(self, asked: int | None) -> int:
        """The data-parallel rank to serve a request: the one it names (400 when out of range), else
        vLLM's least-loaded rank. One rank (SGLang, a single engine): always 0, any header ignored."""
        if self.ranks == 1:
            return 0
        return check_rank(asked, self.ranks) if asked is not None else self.engine.pick_rank()

    async def admit(self, req: ParsedRequest) -> Sequence:
        """Start a request: fetch remote KV first for a disaggregated decode, then schedule it."""
        now = asyncio.get_running_loop().time()
        rank = self.choose_rank(req.data_parallel_rank)  # vLLM checks the rank before the prompt's length
        if req.salt is not None and req.hashes:
            self.pool.salt(req.hashes[0], req.salt)
        if req.prompt_tokens + req.max_tokens > self.pool.rank_blocks * self.pool.block_size:
            raise ApiError(f"request needs more KV blocks than this engine has ({self.pool.rank_blocks}).")
        kv = req.kv_transfer_params if self.connector else None
        remote_prefill, remote_decode = nixl_flags(kv) if kv else (False, False)
        remote = nixl_remote(kv, self.pool.num_blocks, self.peers) if kv and remote_prefill else None
        mode = self.cfg.disaggregation_mode if self.sglang else None
        if req.bootstrap is not None and mode == "decode":
            check_peer(self.peers, req.bootstrap.host, "bootstrap_host")
        decode_hop = remote is not None or (mode == "decode" and req.bootstrap is not None)
        problem = self.problem()
        if problem and not (decode_hop and self.draining):  # a draining decode still takes promised KV
            raise ApiError(f"worker unavailable ({problem}); retry on another replica.", status=503)
        if decode_hop:
            seq = await self._remote_prefill(req, remote, now, rank)
        else:
            # vLLM leases a prefill's blocks only when it stops at max_tokens (FINISHED_LENGTH_CAPPED).
            hold = remote_decode and req.finish_reason == "length"
            seq = Sequence(req.prompt_tokens, req.hashes, req.max_tokens, now, hold=hold, streamed=req.stream,
                           rank=rank)  # fmt: skip
            if hold:
                seq.on_done = lambda: self._lease(seq)
            if mode == "prefill" and req.bootstrap is not None:
                room = req.bootstrap.room
                seq.max_tokens = 1
                seq.on_done = lambda: self._publish_room(room, seq)
        seq.tokens = req.tokens
        if self.cfg.zero_delay:
            self.engine.instant(seq, now)
        else:
            self.engine.submit(seq)
        return seq

    def _lease(self, seq: Sequence) -> None:
        """The finished prefill's blocks move under an expiring lease (streamed or not)."""
        if seq.blocks > 0:
            seq.lease = self.leases.grant(seq.blocks, seq.prompt, asyncio.get_running_loop().time(), seq.rank)[0]
            seq.blocks = 0

    def finish(self, seq: Sequence | None, delivered: bool) -> None:
        """A handler is done with `seq`: abort it if unfinished, free a lease nobody will ever read."""
        if seq is None:
            return
        if not seq.done:
            self.engine.abort(seq)
        elif seq.lease is not None and not delivered and not seq.streamed:
            self.leases.drop(seq.lease)
            seq.lease = None

    def _placement(self) -> dict[str, Any]:
        return {"tp_size": self.cfg.tp, "xpyd_nvlink_domain": self.cfg.nvlink_domain,
                "xpyd_node_name": self.cfg.node_name, "xpyd_gpu": self.gpu.name}  # fmt: skip

    def _publish_room(self, room: int, seq: Sequence) -> None:
        info = dict(self._placement(), tokens=seq.prompt)
        self.rooms.publish(room, info, asyncio.get_running_loop().time())

    async def _fetch(self, req: ParsedRequest, remote: RemoteKv | None, rank: int) -> dict[str, Any] | None:
        """Pull the prompt's KV (Nixl) or wait for its room (SGLang); None: load failed, recompute.

        The decode waits on its rank meanwhile (vLLM's WAITING_FOR_REMOTE_KVS counts as waiting)."""
        assert self._session is not None
        self.engine.pulling[rank] += 1
        self.engine.gauges()
        try:
            if remote is not None:
                delay = await self._injected(remote)
                _, handshake = await pull_blocks(self._session, remote)
                if (problem := self.handshake_problem(handshake)) is not None:
                    raise failed_pull(remote, problem)
                return {"tp_size": remote.tp_size, "xpyd_nvlink_domain": remote.nvlink_domain,
                        "xpyd_node_name": remote.node_name, "fault_delay": delay}  # fmt: skip
            assert req.bootstrap is not None
            return await wait_room(self._session, req.bootstrap, self.cfg.kv_lease_seconds)
        except ApiError as exc:
            if remote is not None:
                self.rank_metrics[rank].nixl_failed += 1
            if not self.recompute_failed_loads:
                log.warning("%s", exc.message)
                raise
            log.warning("%s; recomputing the prompt (kv_load_failure_policy=recompute)", exc.message)
            return None
        finally:
            self.engine.pulling[rank] -= 1
            self.engine.gauges()

    async def _injected(self, remote: RemoteKv) -> float:
        """An injected fault on this pull (faults.py): waits its delay, raises its failure; returns the delay."""
        if self.fault is None:
            return 0.0
        delay, fails = self.fault.hit(remote.host, remote.port, asyncio.get_running_loop().time())
        if delay > 0:
            await asyncio.sleep(delay)
        if fails:
            raise failed_pull(remote, "NIXL read failed (injected by --fault-kv-pull-fail-from)")
        return delay

    async def _remote_prefill(self, req: ParsedRequest, remote: RemoteKv | None, now: float, rank: int) -> Sequence:
        """Fetch the prompt's KV from its prefill worker (Nixl pull or SGLang room), model the handoff."""
        info = await self._fetch(req, remote, rank)
        if info is None:
            return Sequence(req.prompt_tokens, req.hashes, req.max_tokens, now, streamed=req.stream, rank=rank)
        hits = self.pool.match(req.hashes, rank)
        local = min(hits * self.pool.block_size, req.prompt_tokens - 1)
        domain = info.get("xpyd_nvlink_domain")
        same_node = bool(self.cfg.node_name) and info.get("xpyd_node_name") == self.cfg.node_name
        path = "NVLink" if same_node else path_between(domain if isinstance(domain, str) else None,
                                                       self.cfg.nvlink_domain)  # fmt: skip
        remote_tp = info.get("tp_size")
        prefill_tp = remote_tp if type(remote_tp) is int and remote_tp > 0 else self.cfg.tp
        lanes = handoff_lanes(self.spec, prefill_tp, self.cfg.tp, self.cfg.dp_attention)
        moved = kv_bytes(self.spec, req.prompt_tokens - local)
        seconds = handoff_seconds(moved, path, self.gpu, lanes)
        if remote is not None:  # one NIXL transfer, as the decode's connector times it (an injected delay too)
            self.rank_metrics[rank].nixl_time.observe(seconds / self.cfg.speedup + float(info.get("fault_delay", 0)))
            self.rank_metrics[rank].nixl_bytes.observe(float(moved))
        if not self.cfg.zero_delay:
            await asyncio.sleep(seconds / self.cfg.speedup)
        m = self.rank_metrics[rank]
        m.prefix_queries += req.prompt_tokens
        m.prefix_hits += local
        seq = Sequence(req.prompt_tokens, req.hashes, req.max_tokens, now, computed=req.prompt_tokens - 1,
                       streamed=req.stream, rank=rank)  # fmt: skip
        seq.cached = local
        return seq

    def handshake(self) -> dict[str, Any]:
        """What this worker's side channel tells a decode before it reads the KV (NIXL's handshake)."""
        return {"engine_rev": self.cfg.engine_rev, "facts": self.facts.as_dict()}

    def handshake_problem(self, remote: dict[str, Any]) -> str | None:
        """Why this decode cannot read KV from the prefill whose handshake this is, as vLLM would refuse it.

        Another engine revision (both workers told theirs, XPYD_ENGINE_REV) is refused as the router should
        never pair it; incompatible facts as the newest vLLM's NixlConnector refuses them."""
        rev = remote.get("engine_rev")
        if self.cfg.engine_rev and isinstance(rev, str) and rev and rev != self.cfg.engine_rev:
            return (
                f"NIXL compatibility hash mismatch: the prefill runs engine revision {rev[:63]}, this decode "
                f"{self.cfg.engine_rev}; prefill and decode instances have incompatible configurations"
            )
        facts = remote.get("facts")
        if not isinstance(facts, dict):
            return None  # an emulator without a handshake: nothing to compare
        try:
            theirs = handoff.HandoffFacts(**facts)
            return handoff.engine_refusal(theirs, self.facts)
        except (TypeError, ValueError, ZeroDivisionError):
            return "malformed handshake from the prefill's side channel"

    def kv_params(self, seq: Sequence) -> dict[str, Any] | None:
        """The kv_transfer_params a remote-decode prefill returns (its blocks already under a lease)."""
        if seq.lease is None:
            return None
        blocks = self.pool.blocks_for(seq.prompt)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(seq.lease, seq.lease + blocks)),
            "remote_host": self.cfg.side_channel_host,
            "remote_port": self.cfg.side_channel_port,
            **self._placement(),
        }


def failed_pull(remote: RemoteKv, problem: str) -> ApiError:
    """A KV pull that failed, answered as vLLM's decode answers a failed KV load (HTTP 500)."""
    return ApiError(f"KV transfer from {remote.engine_id} at {remote.host}:{remote.port} failed: {problem}", status=500)


def handoff_facts(cfg: EmulatorConfig) -> handoff.HandoffFacts:
    """This worker's handoff facts from its engine command line (xpyd_api.handoff, as the operator reads a spec)."""
    connector = str((cfg.kv_transfer_config or {}).get("kv_connector") or "")
    defaults = {"tp": cfg.tp, "pp": cfg.layout.pp, "dp": cfg.dp}
    facts = handoff.argv_facts(cfg.engine, cfg.extra_args, connector=connector, model=cfg.model, defaults=defaults)
    return replace(facts, block_size=str(cfg.block_size), version=cfg.engine_version or facts.version)


def sglang_labels(model: str, mode: str | None) -> str:
    """SGLang's scheduler metric labels (observability/metrics_collector.py), for one scheduler."""
    kind = mode or "unified"
    return f'engine_type="{kind}",model_name="{model}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
