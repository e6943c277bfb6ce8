"""The workload shapes of the cache-routing suite: synthetic generators and the real traces, as trace requests.

Every synthetic shape is deterministic for its seed and builds its prompts from chained block ids
(block j's id depends on blocks 0..j, as vLLM's prefix-cache hashes do), so two prompts share
exactly the blocks of their common prefix:

- chat: multi-turn conversations under a few shared system prompts (Zipf-popular); each turn's
  prompt is the system prompt, the whole history and the new message.
- rag: one shared instruction, then k documents retrieved from a Zipf-popular corpus, then a question.
- agent: tool-calling loops: a long shared tool-definition prompt per agent kind, then many quick
  steps per session, each appending a tool result and the model's call.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xpyd_sim import trace as traces
from xpyd_sim.trace import TraceRequest
from xpyd_sim.trace import ideal_hit_ratio as ideal_hit_ratio  # the suite reports it per scenario

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "data" / "traces"
_MASK = (1 << 61) - 1


def _chain(parent: int, content: int) -> int:
    """The id of a block: its content chained onto its parent's id (never 0)."""
    return ((parent * 0x9E3779B97F4A7C15) ^ (content * 0xC2B2AE3D27D4EB4F) ^ (parent >> 17)) & _MASK or 1


def _blocks(parent: int, contents: list[int]) -> list[int]:
    out = []
    for c in contents:
        parent = _chain(parent, c)
        out.append(parent)
    return out


def _lognormal(rng: random.Random, mean: float, sigma: float = 0.6) -> int:
    return max(1, int(rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)))


def _zipf_weights(n: int, alpha: float) -> list[float]:
    return [1.0 / (i + 1) ** alpha for i in range(n)]


@dataclass(frozen=True)
class Shape:
    """A synthetic workload: request rate, duration, block size and the shape's own knobs."""

    rate: float = 20.0  # requests per second, all sessions together
    duration: float = 300.0
    block_tokens: int = 64
    seed: int = 0


def _request(t: float, tokens: list[int], prompt: int, out: int, bt: int) -> TraceRequest:
    """A request whose prompt is the first `prompt` tokens of a stream whose blocks are `tokens`."""
    return TraceRequest(t, prompt, out, tuple(tokens[: prompt // bt]))


def chat(
    s: Shape,
    systems: int = 8,
    system_tokens: int = 2000,
    turns: float = 6.0,
    think_s: float = 15.0,
    user_tokens: int = 150,
    answer_tokens: int = 250,
) -> list[TraceRequest]:
    """Multi-turn chat: conversations start at rate/turns per second, one of `systems` shared system prompts each."""
    rng = random.Random(s.seed)
    bt = s.block_tokens
    sys_weights = _zipf_weights(systems, 1.0)
    sys_blocks = [_blocks(1000 + i, list(range(system_tokens // bt))) for i in range(systems)]
    out: list[TraceRequest] = []
    t, conv = 0.0, 0
    while True:
        t += rng.expovariate(s.rate / turns)
        if t >= s.duration:
            break
        conv += 1
        sys_i = rng.choices(range(systems), sys_weights)[0]
        stream = list(sys_blocks[sys_i])  # the conversation's blocks so far (history as one stream)
        length, at = len(stream) * bt, t
        n_turns = 1 + int(rng.expovariate(1.0 / (turns - 1))) if turns > 1 else 1
        for _ in range(n_turns):
            length += _lognormal(rng, user_tokens)
            stream += _blocks(stream[-1], [conv * 100_000 + len(stream) + k for k in range(length // bt - len(stream))])
            answer = _lognormal(rng, answer_tokens)
            out.append(_request(at, stream, length, answer, bt))
            length += answer
            at += rng.expovariate(1.0 / think_s) + 1.0
            if at >= s.duration:
                break
    return sorted(out, key=lambda r: r.arrival)


def rag(
    s: Shape,
    docs: int = 3000,
    doc_tokens: int = 800,
    k: int = 4,
    alpha: float = 1.1,
    instruction_tokens: int = 400,
    question_tokens: int = 60,
    answer_tokens: int = 200,
) -> list[TraceRequest]:
    """RAG: a shared instruction, k Zipf-popular documents (most relevant first), a fresh question."""
    rng = random.Random(s.seed)
    bt = s.block_tokens
    weights = _zipf_weights(docs, alpha)
    cum = list(__import__("itertools").accumulate(weights))
    head = _blocks(7, list(range(instruction_tokens // bt)))
    out: list[TraceRequest] = []
    t, n = 0.0, 0
    while True:
        t += rng.expovariate(s.rate)
        if t >= s.duration:
            break
        n += 1
        picked: list[int] = []
        while len(picked) < k:
            d = __import__("bisect").bisect(cum, rng.random() * cum[-1])
            if d not in picked:
                picked.append(d)
        stream = list(head)
        for d in picked:  # a document's blocks chain onto whatever precedes it
            stream += _blocks(stream[-1], [d * 1000 + j for j in range(doc_tokens // bt)])
        prompt = len(stream) * bt + _lognormal(rng, question_tokens)
        stream += _blocks(stream[-1], [10**9 + n * 100 + j for j in range(4)])
        out.append(_request(t, stream, prompt, _lognormal(rng, answer_tokens), bt))
    return out


def agent(
    s: Shape,
    kinds: int = 4,
    tools_tokens: int = 6000,
    steps: float = 12.0,
    step_gap_s: float = 2.0,
    result_tokens: int = 600,
    call_tokens: int = 80,
    task_tokens: int = 300,
) -> list[TraceRequest]:
    """Agentic loops: sessions of `steps` quick calls; each appends a tool result and the model's last call."""
    rng = random.Random(s.seed)
    bt = s.block_tokens
    kind_blocks = [_blocks(5000 + i, list(range(tools_tokens // bt))) for i in range(kinds)]
    out: list[TraceRequest] = []
    t, sess = 0.0, 0
    while True:
        t += rng.expovariate(s.rate / steps)
        if t >= s.duration:
            break
        sess += 1
        stream = list(kind_blocks[rng.randrange(kinds)])
        length, at = len(stream) * bt + _lognormal(rng, task_tokens), t
        n_steps = 1 + int(rng.expovariate(1.0 / (steps - 1)))
        for _ in range(n_steps):
            stream += _blocks(stream[-1], [sess * 100_000 + len(stream) + j for j in range(length // bt - len(stream))])
            call = _lognormal(rng, call_tokens)
            out.append(_request(at, stream, length, call, bt))
            length += call + _lognormal(rng, result_tokens, 0.9)
            at += step_gap_s * rng.uniform(0.5, 1.5)
            if at >= s.duration:
                break
    return sorted(out, key=lambda r: r.arrival)


def mooncake(max_requests: int | None = None) -> list[TraceRequest]:
    load = list(traces.load(TRACES / "conversation_trace.jsonl"))
    return load[:max_requests] if max_requests else load


def azure(kind: str, copies: int = 1) -> list[TraceRequest]:
    load = list(traces.load(TRACES / f"AzureLLMInferenceTrace_{kind}.csv"))
    return list(traces.scaled(load, copies, seed=0)) if copies > 1 else load


SYNTHETIC: dict[str, Callable[..., list[TraceRequest]]] = {"chat": chat, "rag": rag, "agent": agent}


def working_set_tokens(load: list[TraceRequest], block_tokens: int, window_s: float = 120.0) -> int:
    """The mean number of distinct reusable prefix tokens (blocks requested more than once in the
    trace) asked for within a sliding window: what a pool must cache to serve the reuse it sees."""
    if not load:
        return 0
    counts: dict[int, int] = {}
    for r in load:
        for b in r.blocks:
            counts[b] = counts.get(b, 0) + 1
    samples: list[int] = []
    seen: set[int] = set()
    edge = load[0].arrival + window_s
    for r in load:
        if r.arrival >= edge:
            samples.append(len(seen))
            seen = set()
            edge += window_s * (1 + int((r.arrival - edge) // window_s))
        seen.update(b for b in r.blocks if counts[b] > 1)
    samples.append(len(seen))
    return int(sum(samples) / len(samples)) * block_tokens
