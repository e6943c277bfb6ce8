"""Trace loaders: Mooncake JSONL, Azure CSV and synthetic Poisson load, streamed as simulated requests."""

from __future__ import annotations

import csv
import heapq
import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
# Fresh block ids for traces without hash_ids start here, far above any real trace's ids.
_FRESH_BASE = 1 << 40


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace: arrival time, lengths and the chained prefix block ids of its prompt."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]


class TraceError(ValueError):
    """A trace file that cannot be read, with the line that broke it."""


def _spread(bucket: list[tuple[int, int, int, tuple[int, ...]]], width: float) -> Iterator[TraceRequest]:
    n = len(bucket)
    for i, (ts, inp, out, blocks) in enumerate(bucket):
        yield TraceRequest(ts / 1000.0 + width * i / n, inp, out, blocks)


def load_mooncake(path: Path, bucket_s: float | None = None) -> Iterator[TraceRequest]:
    """Mooncake's conversation trace; arrivals sharing a ~3 s bucket are spread evenly across it."""
    rows: list[tuple[int, int, int, tuple[int, ...]]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                row = (int(d["timestamp"]), int(d["input_length"]), int(d["output_length"]))
                blocks = tuple(int(h) for h in d.get("hash_ids", ()))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: not a Mooncake record ({exc!r})") from exc
            rows.append((*row, blocks))
    rows.sort(key=lambda r: r[0])
    stamps = sorted({r[0] for r in rows})
    if bucket_s is None:
        gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
        bucket_s = gaps[len(gaps) // 2] / 1000.0 if gaps else 0.0
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j][0] == rows[i][0]:
            j += 1
        yield from _spread(rows[i:j], bucket_s)
        i = j


def fresh_blocks(prompt_tokens: int, seq: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[int, ...]:
    """Block ids nobody else shares, for traces that carry no prefix information."""
    n = prompt_tokens // block_tokens
    base = _FRESH_BASE + seq * 4096
    return tuple(range(base, base + min(n, 4096)))


def load_azure(path: Path) -> Iterator[TraceRequest]:
    """Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens); no prefix sharing."""
    rows: list[tuple[float, int, int]] = []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: not an Azure trace, missing columns {sorted(missing)}")
        for lineno, rec in enumerate(reader, 2):
            try:
                stamp = datetime.fromisoformat(rec["TIMESTAMP"].strip()[:26]).timestamp()
                rows.append((stamp, int(rec["ContextTokens"]), int(rec["GeneratedTokens"])))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: bad Azure row ({exc})") from exc
    rows.sort()
    t0 = rows[0][0] if rows else 0.0
    for seq, (stamp, inp, out) in enumerate(rows):
        yield TraceRequest(stamp - t0, inp, out, fresh_blocks(inp, seq))


@dataclass(slots=True, frozen=True)
class Synthetic:
    """Poisson arrivals with log-normal lengths; `shared_prefixes` > 0 makes prompts share system prompts."""

    rate: float = 5.0
    duration: float = 600.0
    prompt_mean: int = 2048
    output_mean: int = 256
    shared_prefixes: int = 0
    shared_tokens: int = 1024
    seed: int = 0


def synthetic(cfg: Synthetic) -> Iterator[TraceRequest]:
    """Generate a synthetic trace deterministically from its seed."""
    if cfg.rate <= 0 or cfg.duration <= 0:
        raise TraceError("synthetic load needs a positive rate and duration")
    rng = random.Random(cfg.seed)
    t, seq = 0.0, 0
    sigma = 0.6
    while True:
        t += rng.expovariate(cfg.rate)
        if t >= cfg.duration:
            return
        inp = max(1, int(rng.lognormvariate(math.log(cfg.prompt_mean) - sigma**2 / 2, sigma)))
        out = max(1, int(rng.lognormvariate(math.log(cfg.output_mean) - sigma**2 / 2, sigma)))
        own = fresh_blocks(inp, seq)
        if cfg.shared_prefixes > 0:
            group = rng.randrange(cfg.shared_prefixes)
            n_shared = min(cfg.shared_tokens, inp) // MOONCAKE_BLOCK_TOKENS
            shared = tuple(group * 4096 + k for k in range(n_shared))
            own = shared + own[n_shared:]
        yield TraceRequest(t, inp, out, own)
        seq += 1


def _shifted(reqs: Iterable[TraceRequest], copy: int, jitter: float) -> Iterator[TraceRequest]:
    offset = copy << 44
    for r in reqs:
        yield TraceRequest(r.arrival + jitter, r.prompt_tokens, r.output_tokens, tuple(b + offset for b in r.blocks))


def scaled(load: list[TraceRequest], copies: int, seed: int = 0) -> Iterator[TraceRequest]:
    """`copies` overlaid replays of a trace, each with its own prefix ids and a small time shift."""
    if copies < 1:
        raise TraceError(f"scale must be >= 1, got {copies}")
    rng = random.Random(seed)
    streams = [_shifted(load, c, 0.0 if c == 0 else rng.uniform(0.0, 3.0)) for c in range(copies)]
    return heapq.merge(*streams, key=lambda r: r.arrival)


def load(path: Path) -> Iterator[TraceRequest]:
    """Pick the loader by the file's extension: .jsonl is Mooncake, .csv is Azure."""
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    if path.suffix in {".jsonl", ".json"}:
        return load_mooncake(path)
    if path.suffix == ".csv":
        return load_azure(path)
    raise TraceError(f"{path}: unknown trace format (want .jsonl Mooncake or .csv Azure)")


def ideal_hit_ratio(load: Iterable[TraceRequest], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> float:
    """Prefix reuse an infinite cache shared by all workers would allow: prompt tokens in blocks some
    earlier request had."""
    seen: set[int] = set()
    hit = total = 0
    for r in load:
        n = 0
        for b in r.blocks:
            if b not in seen:
                break
            n += 1
        hit += min(n * block_tokens, r.prompt_tokens - 1)
        total += r.prompt_tokens
        seen.update(r.blocks)
    return hit / total if total else 0.0
