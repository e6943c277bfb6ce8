"""Trace replay on modelled emulators: prefix hit ratio, TTFT and load balance per routing policy."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from procs import BIN, Procs, free_port, router_command, wait_http  # type: ignore[import-not-found]

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
EMULATOR_ARGS = ("--tensor-parallel-size", "4")  # 4 B200s per worker: 2 workers per 8-GPU node
TRACE = Path(os.environ.get("XPYD_TRACE", Path(__file__).resolve().parents[2] / "data/traces/conversation_trace.jsonl"))
BLOCK_TOKENS, CHARS_PER_TOKEN, BUCKET_S = 512, 4, 3.0
MAX_OUTPUT = 32  # decode length is capped to keep the replay short; TTFT does not depend on it
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
]

POLICIES: list[tuple[str, str, list[str]]] = [
    ("xpyd kv-aware", "xpyd", ["--policy", "kv-aware", "--direct-below-chars", "0"]),
    ("xpyd round-robin", "xpyd", ["--policy", "round-robin"]),
    ("xpyd sglang (cache-aware rules)", "xpyd-peers", ["--policy", "sglang"]),
    ("xpyd llm-d (weighted scores)", "xpyd-peers", ["--policy", "llm-d"]),
    ("vllm-router cache_aware", "vllm", ["--policy", "cache_aware"]),
]


def block_text(hash_id: int, cache: dict[int, str]) -> str:
    """The deterministic 512-token (2048-character) text a trace hash id stands for."""
    text = cache.get(hash_id)
    if text is None:
        rng = random.Random(hash_id)
        words = [f"<{hash_id}>"]
        while sum(len(w) + 1 for w in words) < BLOCK_TOKENS * CHARS_PER_TOKEN:
            words.append(rng.choice(_WORDS))
        text = cache[hash_id] = " ".join(words)[: BLOCK_TOKENS * CHARS_PER_TOKEN]
    return text


def load_trace(n: int, speed: float, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[float]]:
    rows = []
    with TRACE.open() as f:
        for line, _ in zip(f, range(n), strict=False):
            rows.append(json.loads(line))
    rng = random.Random(seed)
    arrivals = [(r["timestamp"] / 1000 + rng.uniform(0, BUCKET_S)) / speed for r in rows]
    order = sorted(range(len(rows)), key=arrivals.__getitem__)
    cache: dict[int, str] = {}
    bodies = []
    for i in order:
        r = rows[i]
        prompt = "".join(block_text(h, cache) for h in r["hash_ids"])[: r["input_length"] * CHARS_PER_TOKEN]
        bodies.append({
            "model": MODEL, "prompt": prompt, "max_tokens": max(1, min(r["output_length"], MAX_OUTPUT)),
            "stream": True, "ignore_eos": True,
        })  # fmt: skip
    return [rows[i] for i in order], bodies, sorted(arrivals)


def infinite_cache_hit_ratio(rows: list[dict[str, Any]]) -> float:
    seen: set[int] = set()
    hit = total = 0
    for r in rows:
        lead = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            lead += 1
        hit += min(lead * BLOCK_TOKENS, r["input_length"])
        total += r["input_length"]
        seen.update(r["hash_ids"])
    return hit / total


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name == "xpyd_router_decisions_total":  # keep role and reason
                name = line.rsplit(" ", 1)[0].replace('deployment="standalone",', "")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def run_policy(
    logdir: Path, label: str, kind: str, extra: list[str], bodies: list[dict[str, Any]],
    arrivals: list[float], speed: float, prefill_n: int = 4, decode_n: int = 2,
) -> dict[str, Any]:  # fmt: skip
    procs = Procs(logdir)
    try:
        nodes = [f"node-{min(i, prefill_n // 2)}" for i in range(prefill_n)]  # p0+d0, p1+d1, p2+p3
        prefill = [procs.emulator(f"rp-p{i}", f"127.0.86.{10 + i}", False, speed, nodes[i], MODEL, EMULATOR_ARGS)
                   for i in range(prefill_n)]  # fmt: skip
        decode = [procs.emulator(f"rp-d{i}", f"127.0.86.{50 + i}", False, speed, f"node-{i}", MODEL, EMULATOR_ARGS)
                  for i in range(decode_n)]  # fmt: skip
        for e in prefill + decode:
            wait_http(e.url, proc=e)
        port = free_port("127.0.0.1")
        with_domains = kind.startswith("xpyd")
        p_urls = [f"{e.url}@{nodes[i]}" if with_domains else e.url for i, e in enumerate(prefill)]
        d_urls = [f"{e.url}@node-{i}" if with_domains else e.url for i, e in enumerate(decode)]
        router = procs.spawn("rp-router", f"http://127.0.0.1:{port}", router_command(kind, port, p_urls, d_urls, extra))
        wait_http(router.url, "/health", 60, router)
        spec = {"mode": "open", "url": router.url + "/v1/completions", "bodies": bodies, "arrivals": arrivals}
        out = subprocess.run([str(BIN / "python"), str(Path(__file__).with_name("loadgen.py"))],
                             input=json.dumps(spec).encode(), capture_output=True, check=True)  # fmt: skip
        result = json.loads(out.stdout)
        router_stats = scrape(router.url) if kind.startswith("xpyd") else {}
        stats_p = [scrape(e.url) for e in prefill]
        stats_d = [scrape(e.url) for e in decode]
    finally:
        procs.stop_all()
    ok = [r for r in result["results"] if r[2]]
    ttft = [r[0] for r in ok]
    per_p = [s.get("vllm:request_success_total", 0.0) for s in stats_p]
    per_d = [s.get("vllm:request_success_total", 0.0) for s in stats_d]
    hits = sum(s.get("vllm:prefix_cache_hits_total", 0.0) for s in stats_p)
    queries = sum(s.get("vllm:prefix_cache_queries_total", 0.0) for s in stats_p)
    return {
        "policy": label, "ok": len(ok), "n": len(bodies),
        "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p99_ms": pct(ttft, 0.99) * 1e3,
        "prefix_hit_ratio": hits / queries if queries else 0.0,
        "router_estimated_hit_ratio": router_stats.get("xpyd_router_prefix_hit_ratio"),
        "prefill_reasons": {k: v for k, v in router_stats.items() if k.startswith("xpyd_router_decisions")},
        "prefill_requests": per_p, "decode_requests": per_d,
        "prefill_imbalance": max(per_p) / (sum(per_p) / len(per_p)) if sum(per_p) else float("nan"),
        "decode_imbalance": max(per_d) / (sum(per_d) / len(per_d)) if sum(per_d) else float("nan"),
    }  # fmt: skip


def run(logdir: Path, n: int = 400, speed: float = 8.0, only: tuple[str, ...] = ()) -> dict[str, Any]:
    rows, bodies, arrivals = load_trace(n, speed)
    runs: list[dict[str, Any]] = []
    results = {"n": n, "speed": speed, "infinite_cache_hit_ratio": infinite_cache_hit_ratio(rows), "runs": runs}
    for label, kind, extra in POLICIES:
        if only and not label.startswith(only):
            continue
        try:
            row = run_policy(logdir, label, kind, extra, bodies, arrivals, speed)
        except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
            row = {"policy": label, "error": str(exc)[-300:]}
        print(f"replay {label}: {row}", file=sys.stderr, flush=True)
        runs.append(row)
    return results


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), tuple(sys.argv[4:])), indent=1))
