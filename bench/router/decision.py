"""Routing-decision microbenchmark: 128k-character prompt, 64 workers, 1M indexed blocks."""

from __future__ import annotations

import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

from xpyd_router.hashing import affinity_key, block_hashes
from xpyd_router.kv.prefix_index import PrefixIndex
from xpyd_router.model import RouteRequest, WorkerState
from xpyd_router.policy.registry import POLICIES, KvAwareConfig, KvAwarePolicy, make_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is not installed: import it from the root
from bench.baselines import register

PROMPT_CHARS = 128_000
PREFILL, DECODE = 48, 16
INDEXED_BLOCKS = 1_000_000


def _filled_index(workers: list[WorkerState], prompt: str, rng: random.Random) -> PrefixIndex:
    index = PrefixIndex()
    per_worker = INDEXED_BLOCKS // len(workers)
    for w in workers:
        index.set_capacity(w.name, per_worker)
    # Most blocks are unrelated prompts; a few workers hold part of this prompt's prefix.
    for i, w in enumerate(workers):
        base = rng.getrandbits(62)
        index.record(w.name, [base + k for k in range(per_worker)])
        if i % 8 == 0:
            index.record(w.name, block_hashes(prompt[: rng.randrange(1, len(prompt))]))
    return index


def _pcts(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {
        "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
        "p99_us": round(samples[int(len(samples) * 0.99)] * 1e6, 1),
    }


def run(iterations: int = 2000, seed: int = 1) -> dict[str, Any]:
    register()  # the peers' routing rules (llm-d, SGLang) beside the product's
    rng = random.Random(seed)
    prompt = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(PROMPT_CHARS))
    prefill = [WorkerState(f"http://10.0.0.{i}:8000", "prefill", f"n{i // 8}") for i in range(PREFILL)]
    decode = [WorkerState(f"http://10.0.1.{i}:8000", "decode", f"n{i // 2}") for i in range(DECODE)]
    for w in prefill + decode:
        w.waiting, w.running, w.kv_usage = rng.randrange(4), rng.randrange(8), rng.random()
    index = _filled_index(prefill + decode, prompt, rng)
    gc.collect()
    gc.freeze()  # as the router does: the long-lived index is not rescanned by every collection
    indexed = len(index)
    results: dict[str, Any] = {"prompt_chars": PROMPT_CHARS, "workers": PREFILL + DECODE, "indexed_blocks": indexed}
    for name in POLICIES:
        policy = make_policy(name)
        if isinstance(policy, KvAwarePolicy):
            policy = KvAwarePolicy(KvAwareConfig(direct_below_blocks=8))
        wall, cpu = [], []
        for _ in range(iterations):
            start, start_cpu = time.perf_counter(), time.thread_time()
            blocks = block_hashes(prompt)
            policy.plan(RouteRequest(blocks, affinity_key(blocks, prompt)), prefill, decode, index)
            cpu.append(time.thread_time() - start_cpu)
            wall.append(time.perf_counter() - start)
        results[name] = {"wall": _pcts(wall), "cpu": _pcts(cpu)}
    start = time.perf_counter()
    for _ in range(200):
        block_hashes(prompt)
    results["hash_only_mean_us"] = round((time.perf_counter() - start) / 200 * 1e6, 1)
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
