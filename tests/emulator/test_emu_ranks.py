"""The rank protocol in-process: hosts-file resolution, the leader's refusals, joins, heartbeats and goodbyes."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest
from emu_harness import free_port  # type: ignore[import-not-found]

from xpyd_emulator.cmdline import parse_engine_command
from xpyd_emulator.leader import GroupLeader
from xpyd_emulator.member import run_rank
from xpyd_emulator.ranks import MAX_LINE, Identity, RankExit, hosts_lookup, join_leader, resolve, stay_joined

HOST = "127.0.0.31"
ME = Identity(0, 3, "vllm", "deepseek-ai/DeepSeek-R1", 24, "node-0")


def hello(number: int, **changes: object) -> bytes:
    doc = {**Identity(number, 3, "vllm", "deepseek-ai/DeepSeek-R1", 24, f"node-{number}").hello(), **changes}
    return orjson.dumps(doc) + b"\n"


@contextlib.asynccontextmanager
async def leader(silence: float = 5.0) -> AsyncIterator[GroupLeader]:
    group = GroupLeader(ME, HOST, free_port(HOST), silence, on_complete=None)
    await group.start()
    try:
        yield group
    finally:
        await group.stop()


async def ask(group: GroupLeader, line: bytes) -> tuple[dict[str, object] | None, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, group.port)
    writer.write(line)
    await writer.drain()
    reply = await asyncio.wait_for(reader.readline(), 5)
    return (orjson.loads(reply) if reply else None), writer


@pytest.mark.parametrize(
    ("text", "name", "address"),
    [
        ("127.0.0.9 dd-0.dd.ns.svc.cluster.local dd-0.dd.ns\n", "dd-0.dd.ns", "127.0.0.9"),
        ("# comment\n10.0.0.1 other\n10.0.0.2 dd-0.dd.ns.svc.cluster.local # note\n", "dd-0.dd.ns", "10.0.0.2"),
        ("10.0.0.1 dd-0.dd.ns\n10.0.0.2 dd-0.dd.ns\n", "DD-0.dd.NS.", "10.0.0.1"),
        ("10.0.0.1 dd-0.dd.nsx\n\n   \n", "dd-0.dd.ns", None),
        ("", "dd-0.dd.ns", None),
    ],
)
def test_hosts_file_lookup(tmp_path: Path, text: str, name: str, address: str | None) -> None:
    path = tmp_path / "hosts"
    path.write_text(text)
    assert hosts_lookup(name, str(path)) == address
    assert resolve(name, {"XPYD_HOSTS_FILE": str(path)}) == (address or name)


def test_resolve_keeps_addresses_and_falls_back_to_the_resolver(tmp_path: Path) -> None:
    assert resolve("10.1.2.3", {"XPYD_HOSTS_FILE": str(tmp_path / "absent")}) == "10.1.2.3"
    assert resolve("[fd00::1]", {}) == "fd00::1"
    assert resolve("leader.example", {}) == "leader.example"
    with pytest.raises(OSError, match="No such file"):
        resolve("leader.example", {"XPYD_HOSTS_FILE": str(tmp_path / "absent")})


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"hello": 1}\n', "not an xpyd rank hello"),
        (b"[1, 2]\n", "not an xpyd rank hello"),
        (b"x" * (MAX_LINE + 10) + b"\n", "not an xpyd rank hello"),
        (hello(0), "rank 0 is out of range 1..2"),
        (hello(3), "rank 3 is out of range 1..2"),
        (hello(1, rank="1"), "rank 1 is out of range"),
        (hello(1, model="meta-llama/Llama-3.1-8B"), "rank 1 has model 'meta-llama/Llama-3.1-8B'"),
        (hello(2, nodes=4), "rank 2 has nodes '4', the leader 3"),
        (hello(2, world=16), "rank 2 has world '16', the leader 24"),
    ],
)
async def test_leader_refuses_what_is_not_a_rank_of_its_group(line: bytes, error: str) -> None:
    async with leader() as group:
        reply, writer = await ask(group, line)
        writer.close()
        assert reply is not None and reply["ok"] is False and error in str(reply["error"])
        assert group.joined == {}


async def test_leader_health_waits_then_breaks_for_good_on_a_lost_rank() -> None:
    async with leader(silence=3.0) as group:
        assert "waiting for ranks 1, 2 of this 3-node replica" in str(group.problem())
        one, w1 = await ask(group, hello(1))
        assert one == {"ok": True, "nodes": 3}
        dup, w_dup = await ask(group, hello(1))
        assert dup is not None and "rank 1 has already joined" in str(dup["error"])
        assert "waiting for ranks 2 " in str(group.problem()) and "(1/2 joined)" in str(group.problem())
        two, w2 = await ask(group, hello(2))
        assert two is not None and two["ok"] is True and group.problem() is None
        assert group.joined == {1: "node-1", 2: "node-2"}
        w2.close()  # rank 2 drops
        await until(lambda: group.broken is not None)
        assert "rank 2 left the group (connection closed)" in str(group.problem())
        w1.close()  # then rank 1: the first loss stays the reason, and it never clears
        await until(lambda: not group._members)
        assert "rank 2 left" in str(group.problem())
        again, w3 = await ask(group, hello(2))
        assert again is not None and "this group is broken" in str(again["error"])
        for w in (w_dup, w3):
            w.close()


async def until(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    """Polls `condition` by the clock (a loaded machine sleeps longer than asked), up to `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {seconds:g} s")
        await asyncio.sleep(0.01)


async def test_leader_counts_a_silent_rank_lost() -> None:
    async with leader(silence=0.4) as group:
        _, w1 = await ask(group, hello(1))  # joins, never beats
        try:
            await until(lambda: group.broken is not None)  # 0.4 s of silence; a loaded machine checks late
            assert "rank 1 left the group (silent for 0.4 s)" in str(group.problem())
        finally:
            w1.close()


async def test_join_gives_up_after_its_timeout_and_stops_when_refused() -> None:
    me = Identity(1, 3, "vllm", "deepseek-ai/DeepSeek-R1", 24, None)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(RankExit, match=r"could not join the leader 127.0.0.31:\d+ within 0.5 s") as lost:
        await join_leader(HOST, free_port(HOST), me, {}, 0.5)
    assert lost.value.code == 1 and loop.time() - start < 2
    async with leader() as group:
        with pytest.raises(RankExit, match="refused rank 1: rank 1 has world '8', the leader 24"):
            await join_leader(HOST, group.port, Identity(1, 3, "vllm", ME.model, 8, None), {}, 5)


async def test_a_rank_waits_for_a_late_leader_through_the_hosts_file(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"  # absent at first: the leader's address is not known yet
    group = GroupLeader(ME, HOST, free_port(HOST), 5.0)
    me = Identity(2, 3, "vllm", ME.model, 24, "node-2")
    joining = asyncio.create_task(join_leader("dd-0.dd.ns", group.port, me, {"XPYD_HOSTS_FILE": str(hosts)}, 10))
    await asyncio.sleep(0.3)
    hosts.write_text(f"{HOST} dd-0.dd.ns.svc.cluster.local\n")
    await asyncio.sleep(0.3)
    await group.start()
    try:
        reader, writer = await asyncio.wait_for(joining, 5)
        assert group.joined == {2: "node-2"}
        stay = asyncio.create_task(stay_joined(reader, writer, 2.0))
        await asyncio.sleep(0.2)
    finally:
        await group.stop()
    ended = await asyncio.wait_for(stay, 5)
    assert (ended.code, str(ended)) == (0, "the leader said goodbye: the leader is shutting down")


async def test_a_rank_exits_1_when_its_leader_falls_silent() -> None:
    done = asyncio.Event()

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b'{"ok": true}\n')
        await done.wait()  # never beats
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(mute, HOST, free_port(HOST))
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await join_leader(HOST, port, Identity(1, 2, "vllm", "m", 2, None), {}, 5)
        ended = await asyncio.wait_for(stay_joined(reader, writer, 0.5), 5)
        done.set()
        await asyncio.sleep(0.05)
    assert (ended.code, str(ended)) == (1, "lost the leader (silent for 0.5 s)")


async def test_sglang_rank_serves_only_a_dummy_health_once_joined() -> None:
    port = free_port(HOST)
    cmd = (f"python3 -m sglang.launch_server --model-path {ME.model} --port {free_port('127.0.0.32')} --tp 24 "
           f"--nnodes 3 --node-rank 1 --dist-init-addr {HOST}:{port}")  # fmt: skip
    cfg = parse_engine_command(shlex.split(cmd), {"XPYD_BIND_HOST": "127.0.0.32", "XPYD_NVLINK_DOMAIN": "node-1"})
    group = GroupLeader(Identity(0, 3, "sglang", ME.model, 24, "node-0"), HOST, port, 5.0)
    await group.start()
    task = asyncio.create_task(run_rank(cfg, env={}))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                if 1 in group.joined:
                    break
                await asyncio.sleep(0.01)
            base = f"http://127.0.0.32:{cfg.port}"
            for path, status in (("/health", 200), ("/health_generate", 200), ("/v1/models", 404)):
                async with http.get(base + path) as resp:
                    assert resp.status == status, path
    finally:
        await group.stop()
    assert await asyncio.wait_for(task, 5) == 0
