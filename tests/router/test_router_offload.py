"""Long prompts are tokenized on a thread, short ones on the event loop; the keys are the same."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from xpyd_router.kv.block_keys import RequestKeys
from xpyd_router.metrics import RouterMetrics
from xpyd_router.policy.registry import make_policy
from xpyd_router.pool import WorkerPool
from xpyd_router.proxy import OFFLOAD_CHARS, Proxy, ProxyConfig
from xpyd_router.tokens.cache import encode_unlocked
from xpyd_router.tokens.engine import EmulatorTokenizer, Ids


class Recording(EmulatorTokenizer):
    """The emulator's tokens, noting the thread each prompt was tokenized on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def prompt_ids(self, body: Any, text: str, chat: bool) -> Ids:
        self.threads.append(threading.current_thread().name)
        return super().prompt_ids(body, text, chat)


def proxy_with(threads: int) -> tuple[Proxy, Recording]:
    tok = Recording()
    pool = WorkerPool(make_policy("kv-aware"), 256, keys=RequestKeys(tok, 16, 256, 4.0))
    return Proxy(pool, RouterMetrics("t", CollectorRegistry()), ProxyConfig(tokenizer_threads=threads)), tok


@pytest.mark.parametrize(
    ("threads", "chars", "on_thread"),
    [
        (2, OFFLOAD_CHARS - 1, False),  # short: on the loop
        (2, OFFLOAD_CHARS, True),
        (1, 4 * OFFLOAD_CHARS, True),
        (0, 4 * OFFLOAD_CHARS, False),  # offload turned off
    ],
)
async def test_where_a_prompt_is_tokenized(threads: int, chars: int, on_thread: bool) -> None:
    proxy, tok = proxy_with(threads)
    text = "".join(chr(0x41 + i % 26) for i in range(chars))
    body = {"prompt": text}
    try:
        got = await proxy._keys(body, text, chat=False)
    finally:
        proxy.close()
    assert got == proxy.pool.keys.for_request(body, text, chat=False) != []
    assert tok.threads[0].startswith("xpyd-tokenize") is on_thread
    assert tok.threads[1] == threading.current_thread().name  # the direct call above


async def test_the_loop_serves_while_a_thread_tokenizes() -> None:
    """A prompt keyed on a thread leaves the loop free: a task scheduled meanwhile runs before it ends."""
    proxy, tok = proxy_with(2)
    release = threading.Event()
    original = tok.prompt_ids

    def slow(body: Any, text: str, chat: bool) -> Ids:
        assert release.wait(10), "the loop never ran while the thread tokenized"
        return original(body, text, chat)

    tok.prompt_ids = slow  # type: ignore[method-assign]
    text = "x" * OFFLOAD_CHARS
    loop = asyncio.get_running_loop()
    loop.call_soon(release.set)  # runs only if the loop is not blocked by the tokenization
    try:
        keys = await asyncio.wait_for(proxy._keys({"prompt": text}, text, chat=False), 20)
    finally:
        proxy.close()
    assert keys


def test_tokenizing_on_a_thread_lets_the_main_thread_run(tmp_path: Path) -> None:
    """encode_unlocked releases the GIL while Rust encodes (tokenizers' `encode` holds it throughout):
    while a thread encodes a long text over and over, the main thread's 1 ms sleeps keep returning in
    a small fraction of one encode's time. Self-calibrated on this machine's encode time."""
    tok = _trained_bpe(tmp_path)
    text = " ".join(f"word{i % 997} {i}" for i in range(40_000))  # about 400k characters
    start = time.perf_counter()
    encode_unlocked(tok, text)
    one = time.perf_counter() - start
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            encode_unlocked(tok, text)

    worker = threading.Thread(target=work)
    worker.start()
    gaps: list[float] = []
    try:
        last = time.perf_counter()
        while len(gaps) < 50:
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    finally:
        stop.set()
        worker.join(30)
    gaps.sort()
    assert gaps[len(gaps) // 2] < one / 4, (gaps[len(gaps) // 2], one)


def _trained_bpe(tmp_path: Path) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"word{i % 997} {i}" for i in range(20_000)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=2_000, show_progress=False))
    return tok
