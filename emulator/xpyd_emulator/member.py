"""A non-API rank of a multi-node replica: it joins its leader, holds on, and ends when the leader goes.

vLLM's `--headless` ranks serve no HTTP at all. SGLang's node ranks > 0 serve only a dummy `/health`
and `/health_generate` on --port once their schedulers are up (SGLang 0.5's
launch_dummy_health_check_server), so the emulator does the same after joining. The process exits 1
when it cannot join within `--join-timeout`, when the leader refuses it, or when the leader's
connection drops or falls silent for `--heartbeat-timeout`; 0 on SIGTERM or a leader's goodbye.

A vLLM data-parallel member with `--kv-events-config` serves its ranks' KV events once joined
(kv_relay.py): the leader models every rank, the member republishes its own on its own address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping

from xpyd_emulator.cmdline import EmulatorConfig
from xpyd_emulator.kv_relay import KvEventRelay, relayed
from xpyd_emulator.listener import BACKLOG, Limits, connection_cap, make_server
from xpyd_emulator.ranks import Identity, RankExit, join_leader, resolve, stay_joined
from xpyd_http.messages import Reply, Request
from xpyd_http.server import Server

log = logging.getLogger("xpyd.emulator")


def identity(cfg: EmulatorConfig, rank: int | None = None) -> Identity:
    """What this pod tells (or, as the leader, requires of) the other ranks of its group."""
    group = cfg.group
    rank = group.rank if rank is None else rank
    return Identity(rank, group.nodes, cfg.engine, cfg.model, cfg.layout.world, cfg.nvlink_domain)


async def _ok(request: Request) -> Reply:
    return Reply(200, b"", "application/octet-stream")


async def _dummy_health(cfg: EmulatorConfig) -> Server:
    limits = Limits(cfg.header_timeout, cfg.body_timeout, cfg.max_body_bytes, connection_cap(cfg.max_connections))
    server = make_server({("GET", "/health"): _ok, ("GET", "/health_generate"): _ok}, limits)
    try:
        await server.listen(cfg.host, cfg.port, backlog=BACKLOG)
    except BaseException:
        await server.close(1.0)
        raise
    return server


def hosted_ranks(cfg: EmulatorConfig) -> range:
    """The vLLM data-parallel ranks this pod hosts: `--data-parallel-size-local` from its start rank."""
    group, dp = cfg.group, cfg.layout.dp
    if cfg.engine != "vllm" or dp == 1:
        return range(0)  # SGLang, or tensor/pipeline parallel over nodes: the leader's one engine publishes
    local = dp // group.nodes
    return range(group.rank * local, (group.rank + 1) * local)


def start_relay(cfg: EmulatorConfig, env: Mapping[str, str]) -> KvEventRelay | None:
    """Relay this member's ranks' KV events from the leader, when it has ranks and events bind (OSError)."""
    events, ranks = cfg.kv_events, hosted_ranks(cfg)
    if events is None or not cfg.enable_prefix_caching or not ranks or not relayed(events.endpoint):
        return None
    leader = resolve(cfg.group.leader_host, env)
    if leader == cfg.host:  # one address for both pods: the leader's sockets already answer there
        return None
    relay = KvEventRelay(events, ranks, leader, cfg.host)
    log.info("relaying the KV events of ranks %d..%d from %s", ranks[0], ranks[-1], leader)
    return relay


async def _first(work: asyncio.Task[RankExit], stop: asyncio.Event) -> RankExit | None:
    """`work`'s result (or the RankExit it raised), or None when `stop` is set first (work cancelled)."""
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, RankExit):
            await work
        return None
    try:
        return work.result()
    except RankExit as exc:
        return exc


async def run_rank(cfg: EmulatorConfig, stop: asyncio.Event | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run this pod as rank `cfg.group.rank` until it must end; returns the exit code."""
    group, stop = cfg.group, stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    me = identity(cfg)
    env = dict(os.environ) if env is None else env
    log.info("rank %d of a %d-node %s replica (%d GPUs); joining the leader %s:%d", group.rank, group.nodes,
             cfg.engine, cfg.layout.world, group.leader_host, group.leader_port)  # fmt: skip
    link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def join() -> RankExit:
        nonlocal link
        link = await join_leader(group.leader_host, group.leader_port, me, env, cfg.join_timeout)
        return RankExit("joined", 0)

    health: Server | None = None
    relay: KvEventRelay | None = None
    try:
        ended = await _first(asyncio.create_task(join()), stop)
        if ended is None:
            log.info("stopped before joining")
            return 0
        if link is None:
            return _report(ended)
        log.info("rank %d joined its leader", group.rank)
        relay = start_relay(cfg, env)
        if cfg.engine == "sglang":
            health = await _dummy_health(cfg)
        ended = await _first(asyncio.create_task(stay_joined(*link, cfg.heartbeat_timeout)), stop)
        if ended is None:
            log.info("stopping on a signal; the leader will count this rank lost")
            return 0
        return _report(ended)
    finally:
        if link is not None:
            link[1].close()
        if relay is not None:
            await asyncio.to_thread(relay.close)
        if health is not None:
            await health.close(1.0)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def _report(ended: RankExit) -> int:
    if ended.code:
        log.error("rank exits: %s", ended)
    else:
        log.info("rank exits: %s", ended)
    return ended.code
