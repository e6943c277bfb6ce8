"""API keys rotated by rewriting --api-key-file under a running router: several keys, one a line."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from stub_workers import call  # type: ignore[import-not-found]

from xpyd_http.server import Server
from xpyd_router.http.access import KEY_CHECK_S, ApiKey
from xpyd_router.loadshare import PATH, LoadShare
from xpyd_router.policy.registry import make_policy
from xpyd_router.pool import WorkerPool, WorkerSpec

pytestmark = pytest.mark.timeout(30)
Start = Callable[..., Any]


def swap(path: Path, text: str) -> None:
    """Replace the file the way the kubelet updates a Secret volume: a new file moved over the old."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> str:
    return f"Bearer {key}"


def test_keys_follow_the_file_at_most_every_check(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "api-key"
    swap(path, "old-key\n")
    clock = Clock()
    keys = ApiKey(["old-key"], str(path), check_every=2.0, clock=clock)
    assert keys.allows(bearer("old-key")) and not keys.allows(bearer("new-key"))
    swap(path, "old-key\nnew-key\n")  # step 1: add the new key
    clock.now = 1.0
    assert not keys.allows(bearer("new-key"))  # not looked at before check_every
    clock.now = 2.0
    assert keys.allows(bearer("new-key")) and keys.allows(bearer("old-key"))
    assert keys.keys == ("old-key", "new-key")
    swap(path, "new-key\n")  # step 3: clients moved; remove the old key
    clock.now = 4.0
    assert keys.allows(bearer("new-key")) and not keys.allows(bearer("old-key"))
    with caplog.at_level(logging.WARNING, "xpyd_router.http.access"):
        swap(path, "\n")  # a broken rotation: empty
        clock.now = 6.0
        assert keys.allows(bearer("new-key")) and not keys.allows(None)  # never opens the router
        clock.now = 8.0
        assert keys.allows(bearer("new-key"))  # unchanged since: no second warning
        path.unlink()  # unreadable
        clock.now = 10.0
        assert keys.allows(bearer("new-key")) and keys.required
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per change
    assert "keeps the 1 API key(s)" in warnings[0].getMessage()
    swap(path, "newer-key")  # fixed: taken up
    clock.now = 12.0
    assert keys.allows(bearer("newer-key")) and not keys.allows(bearer("new-key"))


async def test_a_running_router_takes_up_a_rotated_key(stubs: Start, router: Start, tmp_path: Path) -> None:
    path = tmp_path / "api-key"
    swap(path, "old-key\n")
    worker = await stubs("worker")
    r = await router([worker], scrape_interval=60, api_key=("old-key",), api_key_file=str(path))

    async def status(key: str) -> int:
        got, _ = await call(r.url, {"prompt": "hi"}, headers={"Authorization": bearer(key)})
        return int(got)

    assert (await status("old-key"), await status("new-key")) == (200, 401)
    swap(path, "new-key\nold-key\n")
    await asyncio.sleep(KEY_CHECK_S + 0.2)
    assert (await status("old-key"), await status("new-key")) == (200, 200)
    swap(path, "new-key\n")
    await asyncio.sleep(KEY_CHECK_S + 0.2)
    assert (await status("old-key"), await status("new-key")) == (401, 200)
    swap(path, "")  # a broken rotation keeps the last good key
    await asyncio.sleep(KEY_CHECK_S + 0.2)
    assert (await status("old-key"), await status("new-key")) == (401, 200)


async def test_peers_mid_rotation_find_the_key_the_other_holds() -> None:
    pool = WorkerPool(make_policy("least-loaded"), 256)
    pool.set_workers([WorkerSpec("http://127.0.0.1:9001", "worker")])
    rotated = LoadShare(pool, [], api_key=["new-key"])  # its file already lost the old key
    server = Server({("GET", PATH): rotated.handle})
    await server.listen("127.0.0.1", 0)
    try:
        other = WorkerPool(make_policy("least-loaded"), 256)
        other.set_workers([WorkerSpec("http://127.0.0.1:9001", "worker")])
        behind = LoadShare(other, [f"http://127.0.0.1:{server.port}"], api_key=["old-key", "new-key"])
        async with aiohttp.ClientSession() as s:
            await behind._poll(s, behind.peers[0])  # 401 with the first key: the next poll tries the next
            assert behind.reports == {}
            await behind._poll(s, behind.peers[0])
        assert list(behind.reports) == behind.peers
    finally:
        await server.close(1.0)
