"""KV peers: a worker pulls KV only from its deployment's peers and checks every protocol field first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from emu_harness import KV_CONFIG, free_port, make_config, running  # type: ignore[import-not-found]

from xpyd_emulator.cmdline import parse_engine_command
from xpyd_emulator.errors import ApiError
from xpyd_emulator.peers import PeerPolicy, bootstrap_fields, nixl_flags, nixl_remote

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GOOD_KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e-1",
           "remote_block_ids": [0, 1], "remote_host": "127.0.0.3", "remote_port": 5600}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "host", "allowed"),
    [
        ("10.1.0.0/16", "10.1.200.7", True),
        ("10.1.0.0/16", "10.2.0.1", False),
        ("10.1.2.3", "10.1.2.3", True),
        ("10.1.2.3", "10.1.2.4", False),
        ("prefill-0.svc,10.0.0.0/8", "PREFILL-0.svc", True),
        ("prefill-0.svc", "prefill-0.svc.evil.example", False),
        ("fd00::/64", "fd00::17", True),
        ("fd00::/64", "10.0.0.1", False),
        ("127.0.0.0/8", "localhost", False),  # names are never resolved
    ],
)
def test_peer_policy(spec: str, host: str, allowed: bool) -> None:
    assert PeerPolicy.parse(spec).allows(host) is allowed


@pytest.mark.parametrize(
    ("side_channel_host", "inside", "outside"),
    [
        ("10.244.3.17", "10.244.200.1", "10.245.0.1"),
        ("127.1.0.9", "127.0.0.1", "10.0.0.1"),
        ("localhost", "127.0.0.5", "192.168.0.1"),
        ("fd00:1::5", "fd00:1::99", "fd00:2::1"),
        ("prefill-0.svc", "prefill-0.svc", "10.0.0.1"),
    ],
)
def test_default_peers_surround_the_side_channel_host(side_channel_host: str, inside: str, outside: str) -> None:
    policy = PeerPolicy.around(side_channel_host)
    assert policy.allows(inside)
    assert not policy.allows(outside)


@pytest.mark.parametrize("spec", ["", " , ", "10.0.0.0/33", "host name", "a/b", "exa_mple.com"])
def test_bad_peer_lists(spec: str) -> None:
    with pytest.raises(ValueError, match="empty|neither"):
        PeerPolicy.parse(spec)


def test_peer_default_and_flag_reach_the_config() -> None:
    cmd = ["vllm", "serve", "m"]
    assert parse_engine_command(cmd, {}).kv_peers is None
    assert parse_engine_command(cmd, {"XPYD_KV_PEERS": "10.0.0.0/8"}).kv_peers == "10.0.0.0/8"
    cfg = parse_engine_command(cmd, {"XPYD_KV_PEERS": "10.0.0.0/8"}, flags={"kv_peers": "10.1.2.3"})
    assert cfg.kv_peers == "10.1.2.3"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"remote_engine_id": 7}, "kv_transfer_params.remote_engine_id"),
        ({"remote_engine_id": "x" * 300}, "kv_transfer_params.remote_engine_id"),
        ({"remote_block_ids": "0,1"}, "kv_transfer_params.remote_block_ids"),
        ({"remote_block_ids": []}, "kv_transfer_params.remote_block_ids"),
        ({"remote_block_ids": [0, True]}, "kv_transfer_params.remote_block_ids"),
        ({"remote_block_ids": [0, -1]}, "kv_transfer_params.remote_block_ids"),
        ({"remote_block_ids": [0, 1 << 40]}, "kv_transfer_params.remote_block_ids"),
        ({"remote_block_ids": list(range(101))}, "kv_transfer_params.remote_block_ids"),
        ({"remote_host": None}, "kv_transfer_params.remote_host"),
        ({"remote_host": "169.254.169.254"}, "kv_transfer_params.remote_host"),
        ({"remote_host": "evil.example"}, "kv_transfer_params.remote_host"),
        ({"remote_port": 0}, "kv_transfer_params.remote_port"),
        ({"remote_port": 65536}, "kv_transfer_params.remote_port"),
        ({"remote_port": "5600"}, "kv_transfer_params.remote_port"),
        ({"tp_size": 0}, "kv_transfer_params.tp_size"),
        ({"xpyd_nvlink_domain": ["a"]}, "kv_transfer_params.xpyd_nvlink_domain"),
    ],
)
def test_nixl_params_are_checked_field_by_field(change: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        nixl_remote(dict(GOOD_KV, **change), max_blocks=100, policy=PeerPolicy.parse("127.0.0.0/8"))
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(
    ("kv", "flags"),
    [
        ({}, (False, False)),
        ({"do_remote_decode": True, "remote_host": None}, (False, True)),
        ({"do_remote_prefill": True}, (True, False)),
        ({"do_remote_prefill": "yes"}, None),
        ({"do_remote_prefill": True, "do_remote_decode": True}, None),
    ],
)
def test_nixl_flags(kv: dict[str, Any], flags: tuple[bool, bool] | None) -> None:
    if flags is None:
        with pytest.raises(ApiError, match="do_remote_prefill"):
            nixl_flags(kv)
    else:
        assert nixl_flags(kv) == flags


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"bootstrap_host": 5, "bootstrap_room": 1}, "bootstrap_host"),
        ({"bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 1}, "bootstrap_port"),
        ({"bootstrap_host": "h", "bootstrap_port": "8998", "bootstrap_room": 1}, "bootstrap_port"),
        ({"bootstrap_host": "h", "bootstrap_room": -1}, "bootstrap_room"),
        ({"bootstrap_host": "h", "bootstrap_room": 1 << 63}, "bootstrap_room"),
        ({"bootstrap_host": "h", "bootstrap_room": 1.5}, "bootstrap_room"),
        ({"bootstrap_host": ["h"], "bootstrap_room": [1]}, "bootstrap_room"),
    ],
)
def test_bootstrap_fields_are_checked(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        bootstrap_fields(body)
    assert (err.value.status, err.value.param) == (400, param)


def test_bootstrap_port_defaults_like_sglang() -> None:
    assert bootstrap_fields({}) is None
    found = bootstrap_fields({"bootstrap_host": "10.0.0.1", "bootstrap_room": 12})
    assert found is not None
    assert (found.host, found.port, found.room) == ("10.0.0.1", 8998, 12)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, data=orjson.dumps(body)) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_foreign_peer_gets_400_without_any_connection(http: aiohttp.ClientSession) -> None:
    connections = 0

    async def trap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    trap_port = free_port("127.0.0.9")
    server = await asyncio.start_server(trap, "127.0.0.9", trap_port)
    cfg = make_config("127.0.0.3", MODEL, "--kv-transfer-config", KV_CONFIG, kv_peers="127.0.0.2/32")
    async with server, running(cfg) as decode:
        slow = asyncio.create_task(post(http, decode + "/v1/completions", {"prompt": "x", "max_tokens": 200}))
        forged = dict(GOOD_KV, remote_host="127.0.0.9", remote_port=trap_port)
        status, doc = await post(http, decode + "/v1/completions", {"prompt": "hi " * 50, "kv_transfer_params": forged})
        assert status == 400
        assert doc["error"]["param"] == "kv_transfer_params.remote_host"
        assert "not a KV peer" in doc["error"]["message"]
        status, doc = await post(http, decode + "/v1/completions",
                                 {"prompt": "x", "kv_transfer_params": dict(forged, remote_port=70000)})  # fmt: skip
        assert (status, doc["error"]["param"]) == (400, "kv_transfer_params.remote_port")
        allowed = dict(GOOD_KV, remote_host="127.0.0.2", remote_port=free_port("127.0.0.2"))
        status, doc = await post(http, decode + "/v1/completions", {"prompt": "x", "kv_transfer_params": allowed})
        assert status == 500  # an allowed peer is dialled (nothing listens there: a failed transfer)
        assert "KV transfer" in doc["error"]["message"]
        assert (await slow)[0] == 200  # the other request never noticed
    assert connections == 0


async def test_side_channel_serves_peers_only(http: aiohttp.ClientSession) -> None:
    cfg = make_config("127.0.0.2", MODEL, "--kv-transfer-config", KV_CONFIG, kv_peers="127.0.0.3")
    async with running(cfg):
        url = f"http://127.0.0.2:{cfg.side_channel_port}/xpyd/kv/pull"
        async with http.post(url, data=b'{"engine_id": "x", "block_ids": [0]}') as resp:
            assert resp.status == 403
            assert (await resp.json())["error"]["code"] == 403


async def test_sglang_decode_refuses_foreign_bootstrap_hosts(http: aiohttp.ClientSession) -> None:
    cmd = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", str(free_port("127.0.0.6")),
           "--disaggregation-mode", "decode"]  # fmt: skip
    cfg = replace(parse_engine_command(cmd, {"XPYD_BIND_HOST": "127.0.0.6"}, speedup=50.0), kv_peers="127.0.0.5")
    async with running(cfg) as decode:
        body = {"prompt": "p", "max_tokens": 2, "bootstrap_host": "10.9.9.9", "bootstrap_room": 1}
        status, doc = await post(http, decode + "/v1/completions", body)
        assert (status, doc["error"]["param"]) == (400, "bootstrap_host")
        status, doc = await post(http, decode + "/v1/completions", dict(body, bootstrap_room="one"))
        assert (status, doc["error"]["param"]) == (400, "bootstrap_room")
