"""A multi-node replica as processes: a leader and two headless vLLM ranks on loopback, found via a hosts file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from emu_harness import free_port  # type: ignore[import-not-found]

XPYD = str(Path(sys.executable).with_name("xpyd"))
LEADER_NAME = "xp-prefill-0.xp-prefill.default"  # what LWS_LEADER_ADDRESS would hold
HOSTS = ("127.0.0.41", "127.0.0.42", "127.0.0.43")
MODEL = "deepseek-ai/DeepSeek-R1"


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    procs: list[asyncio.subprocess.Process] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)


async def start(procs: list[asyncio.subprocess.Process], host: str, hosts: Path, *argv: str) -> None:
    env = dict(os.environ, XPYD_BIND_HOST=host, XPYD_HOSTS_FILE=str(hosts), XPYD_SPEEDUP="50", XPYD_GPU="B200",
               XPYD_NVLINK_DOMAIN=f"node-{host}")  # fmt: skip
    flags = ["--log-level", "WARNING", "--heartbeat-timeout", "1.5", "--join-timeout", "20"]
    proc = await asyncio.create_subprocess_exec(XPYD, "emulate", *flags, "--", *argv, env=env,
                                                stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    procs.append(proc)


async def health(http: aiohttp.ClientSession, base: str) -> tuple[int, str]:
    try:
        async with http.get(base + "/health") as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError:
        return 0, ""


async def until(http: aiohttp.ClientSession, base: str, status: int, seconds: float) -> str:
    """Poll /health until it answers `status`; its body (fails after `seconds`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        got, body = await health(http, base)
        if got == status:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"/health did not answer {status} within {seconds} s (last {got}: {body[:200]})")


async def test_leader_waits_for_its_ranks_and_the_group_falls_together(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"# the local cluster's DNS\n{HOSTS[0]} {LEADER_NAME}.svc.cluster.local {LEADER_NAME}\n")
    port, rpc = free_port(HOSTS[0]), free_port(HOSTS[0])
    engine = ["vllm", "serve", MODEL, "--port", str(port), "--tensor-parallel-size", "1", "--data-parallel-size", "24",
              "--data-parallel-size-local", "8", "--enable-expert-parallel", "--data-parallel-address", LEADER_NAME,
              "--data-parallel-rpc-port", str(rpc)]  # fmt: skip
    base = f"http://{HOSTS[0]}:{port}"
    async with processes() as procs, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await start(procs, HOSTS[0], hosts, *engine)
        body = await until(http, base, 503, 15)
        assert "waiting for ranks 1, 2 of this 3-node replica" in body
        for rank in (1, 2):
            await start(procs, HOSTS[rank], hosts, *engine, "--headless", "--data-parallel-start-rank", str(8 * rank))
        await until(http, base, 200, 15)

        request = {"model": MODEL, "prompt": "hello " * 64, "max_tokens": 16}
        async with http.post(base + "/v1/completions", json=request) as resp:
            doc = await resp.json()
            assert resp.status == 200, doc
        assert doc["usage"]["completion_tokens"] == 16
        async with http.get(base + "/metrics") as resp:
            assert 'vllm:generation_tokens_total{engine="0",model_name="' + MODEL + '"} 16' in await resp.text()

        procs[1].send_signal(signal.SIGKILL)  # one rank dies: the replica is gone until its leader restarts
        body = await until(http, base, 503, 5)
        assert "rank 1 left the group" in body
        async with http.post(base + "/v1/completions", json=request) as resp:
            assert resp.status == 503

        procs[0].send_signal(signal.SIGKILL)  # the leader dies: the remaining rank exits non-zero
        assert await asyncio.wait_for(procs[2].wait(), 1.5 + 5) == 1
        assert await procs[1].wait() == -signal.SIGKILL


async def test_a_rank_without_a_leader_exits_1_after_its_join_timeout(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("")  # the leader never gets an address
    env = dict(os.environ, XPYD_BIND_HOST=HOSTS[1], XPYD_HOSTS_FILE=str(hosts))
    proc = await asyncio.create_subprocess_exec(
        XPYD, "emulate", "--join-timeout", "1", "--", "python3", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--tp", "16", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "no-such-leader.invalid:20000",
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1
    assert b"could not join the leader no-such-leader.invalid:20000 within 1 s" in err
