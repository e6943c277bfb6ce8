"""What long prompts cost everyone else: short requests' latency while long chats are tokenized.

`python bench/router/loop_stall.py` runs `xpyd router` with a real (trained here, 32k BPE, ChatML
template) tokenizer in front of a zero-delay emulator and sends, at once, long chat requests (64k
characters of new text each, about 16k tokens, about 20 ms to tokenize) and short completions, and
measures the short ones' latency through the router. The same load runs with the router's
tokenizing threads off (`--tokenizer-threads 0`: every prompt tokenized on the event loop) and on
(the default 2), in alternating runs of the same length, so the ratio compares like with like on
this noisy machine. Bounded: `--seconds` per run (default 12), `--rounds` pairs (default 2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from kv_cost import CHATML, WORDS, chat_tokenizer, hf_tokenizer  # type: ignore[import-not-found]
from procs import BIN, MODEL, Procs, free_port, wait_http  # type: ignore[import-not-found]

LONG_CHARS = 64 << 10


def long_chat(i: int) -> dict[str, Any]:
    """A chat whose one message is LONG_CHARS of text no earlier request had (nothing cached)."""
    words = [f"{WORDS[(i * 13 + k * 7) % len(WORDS)]}{(i * 7919 + k) % 10007}" for k in range(LONG_CHARS // 8)]
    text = " ".join(words)[:LONG_CHARS]
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}


def short(i: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": f"short request {i}: {' '.join(WORDS)}", "max_tokens": 1}


async def drive(url: str, seconds: float, long_rps: float, short_rps: float) -> dict[str, Any]:
    """Open-loop load: long chats and short completions at fixed rates; the short ones' latencies."""
    latencies: list[float] = []
    long_done = failed = 0

    async def one(session: aiohttp.ClientSession, path: str, body: dict[str, Any], timed: bool) -> None:
        nonlocal long_done, failed
        start = time.perf_counter()
        try:
            async with session.post(url + path, json=body) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if not ok:
            failed += 1
        elif timed:
            latencies.append(time.perf_counter() - start)
        else:
            long_done += 1

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        start = loop.time()
        n_long = n_short = 0
        bodies = [long_chat(i) for i in range(int(seconds * long_rps) + 1)]
        while (now := loop.time() - start) < seconds:
            if n_long < now * long_rps:
                tasks.append(asyncio.create_task(one(session, "/v1/chat/completions", bodies[n_long], False)))
                n_long += 1
            if n_short < now * short_rps:
                tasks.append(asyncio.create_task(one(session, "/v1/completions", short(n_short), True)))
                n_short += 1
            await asyncio.sleep(0.002)
        await asyncio.gather(*tasks)
    latencies.sort()
    return {
        "short": len(latencies),
        "long": long_done,
        "failed": failed,
        "p50": latencies[len(latencies) // 2] if latencies else 0.0,
        "p99": latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        "max": latencies[-1] if latencies else 0.0,
    }


def run_once(procs: Procs, worker: str, tokenizer: Path, template: Path, threads: int, args: Any) -> dict[str, Any]:
    port = free_port("127.0.0.1")
    cmd = [str(BIN / "xpyd"), "router", "--port", str(port), "--host", "127.0.0.1", "--worker", worker]
    cmd += ["--tokenizer", str(tokenizer), "--chat-template", str(template), "--tokenizer-threads", str(threads)]
    router = procs.spawn(f"router-t{threads}", f"http://127.0.0.1:{port}", cmd)
    try:
        wait_http(router.url, proc=router)
        cpu = router.cpu()
        out = asyncio.run(drive(router.url, args.seconds, args.long_rps, args.short_rps))
        out["cpu"] = router.cpu() - cpu
        return out
    finally:
        router.stop()
        procs.items.remove(router)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--long-rps", type=float, default=8.0)
    p.add_argument("--short-rps", type=float, default=40.0)
    p.add_argument("--tokenizer", type=Path, default=Path(tempfile.gettempdir()) / "xpyd-bpe-32k.json")
    p.add_argument("--out", type=Path, help="also write the table as markdown, e.g. bench/results/loop-stall.md")
    args = p.parse_args()
    began = time.time()
    hf_tokenizer(args.tokenizer)
    chat_tokenizer(args.tokenizer)  # writes the ChatML variant beside it
    chatml = args.tokenizer.with_name(f"{args.tokenizer.stem}-chatml.json")
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "chatml.jinja"
        template.write_text(CHATML)
        procs = Procs(Path(tmp))
        try:
            worker = procs.emulator("emu", "127.0.0.1", zero_delay=True)
            wait_http(worker.url, proc=worker)
            results: dict[int, list[dict[str, Any]]] = {0: [], 2: []}
            for _ in range(args.rounds):
                for threads in (0, 2):
                    results[threads].append(run_once(procs, worker.url, chatml, template, threads, args))
                    print(threads, results[threads][-1], flush=True)
        finally:
            procs.stop_all()
    table = report(results, args, time.time() - began)
    print(table)
    if args.out:
        args.out.write_text(table)


def report(results: dict[int, list[dict[str, Any]]], args: Any, wall: float) -> str:
    def mean(threads: int, key: str) -> float:
        return statistics.fmean(r[key] for r in results[threads])

    lines = [
        "# Short requests' latency while long prompts are tokenized",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} "
        f"{os.cpu_count()} cores, Python {sys.version.split()[0]} by `.venv/bin/python bench/router/loop_stall.py` "
        f"({wall:.0f} s). `xpyd router` with a 32k byte-level BPE trained on the standard library and the ChatML "
        "template, one zero-delay emulator behind it; each run sends long chats "
        f"({LONG_CHARS // 1024} KiB of new text each, {args.long_rps:g}/s) and short completions "
        f"({args.short_rps:g}/s) for {args.seconds:g} s; runs alternate between tokenizing on the event loop and on "
        f"the router's threads, {args.rounds} each; the table gives their mean.",
        "",
        "| tokenizing | short p50 ms | short p99 ms | short max ms | long done | failed | router CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for threads, label in ((0, "on the event loop (--tokenizer-threads 0)"), (2, "on 2 threads (default)")):
        lines.append(
            f"| {label} | {mean(threads, 'p50') * 1e3:.1f} | {mean(threads, 'p99') * 1e3:.1f} | "
            f"{mean(threads, 'max') * 1e3:.1f} | {mean(threads, 'long'):.0f} | {mean(threads, 'failed'):.0f} | "
            f"{mean(threads, 'cpu'):.2f} |"
        )
    ratio = mean(0, "p99") / max(1e-9, mean(2, "p99"))
    lines += ["", f"Short requests' p99 on the loop / on threads: {ratio:.2f}x.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
