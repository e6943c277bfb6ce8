"""The deployments and request streams of the KV-tier benchmark, built in code.

- `llmd`: llm-d's published KV-offloading measurement, rebuilt: gpt-oss-120b on 16 H200 (8 prefill
  replicas of TP1, 2 decode replicas of TP4), prefix groups of 16K tokens whose working set is 1.32x
  the prefill pool's GPU KV capacity as the simulator sizes it (xpyd_perf's fits-check), Poisson
  arrivals at one rate per run; every group is asked for once first (a warm-up pass, not measured).
- `private`: long private prefixes (49K tokens, each asked for once or twice, the second time a
  while later) at a rate just past what the prefill pool computes (a queue that grows, as llm-d's
  concurrency 128 keeps one): reuse a GPU cache cannot keep, and little of it.
- `chat`: multi-turn chat with a growing history (bench/cache/workloads.py's generator, with a
  longer system prompt and history), one more shape where evicted history comes back.

Prompts are chained block ids (two prompts share exactly the blocks of their common prefix).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from bench.cache import workloads as wl

from xpyd_sim import spec as specs
from xpyd_sim.perfmodel import PoolPerf
from xpyd_sim.spec import SimSpec
from xpyd_sim.trace import TraceRequest

MODEL = "openai/gpt-oss-120b"
TOPOLOGY = "HGX-H200"
BLOCK_TOKENS = 256  # the simulator's prefix block: 64 of a 16K prefix


def deployment(prefill: int = 8, decode: int = 2) -> SimSpec:
    """llm-d's shape: `prefill` TP1 prefill replicas and `decode` TP4 decode replicas of gpt-oss-120b."""
    doc: dict[str, Any] = {
        "apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment", "metadata": {"name": "kv-tiers"},
        "spec": {"model": {"name": MODEL}, "topology": {"kind": "Any"},
                 "prefill": {"replicas": prefill, "gpusPerReplica": 1, "tensorParallelSize": 1},
                 "decode": {"replicas": decode, "gpusPerReplica": 4, "tensorParallelSize": 4}},
    }  # fmt: skip
    return specs.parse(doc, topology=TOPOLOGY)  # the API offers HGX-B200 and GB200 kinds; the model has H200


def pool_kv_tokens(spec: SimSpec, role: str = "prefill") -> int:
    """The GPU KV capacity of a whole pool in tokens, as the simulator sizes each replica's."""
    p = spec.pools[role]
    perf = PoolPerf(spec.model, spec.topology.gpu, p.tp, p.gpus, spec.kv_bytes_per_token)
    return perf.kv_capacity_tokens * p.replicas


def _ids(base: int, n: int) -> list[int]:
    """Block ids nobody else uses: `n` chained blocks under `base`."""
    return wl._blocks(base, list(range(n)))


@dataclass(frozen=True)
class Groups:
    """llm-d's prefix groups: `groups` shared prefixes of `prefix_tokens`, a fresh question each."""

    rate: float
    duration_s: float
    groups: int
    prefix_tokens: int = 16_384
    question_tokens: int = 256
    output_tokens: int = 256
    seed: int = 0

    @staticmethod
    def sized(spec: SimSpec, ratio: float, prefix_tokens: int = 16_384) -> int:
        """How many groups make a working set `ratio` times the prefill pool's GPU KV capacity."""
        return math.ceil(ratio * pool_kv_tokens(spec) / prefix_tokens)

    def trace(self) -> tuple[list[TraceRequest], float]:
        """The requests, and when the warm-up pass (every group once, in a random order) ends."""
        rng = random.Random(self.seed)
        bt = BLOCK_TOKENS
        heads = [_ids(7_000 + g, self.prefix_tokens // bt) for g in range(self.groups)]
        order = list(range(self.groups))
        rng.shuffle(order)
        out: list[TraceRequest] = []
        t, n = 0.0, 0
        warm_end = 0.0
        while True:
            t += rng.expovariate(self.rate)
            if n == self.groups:
                warm_end = t
            if t >= warm_end + self.duration_s and n >= self.groups:
                break
            g = order[n] if n < self.groups else rng.randrange(self.groups)
            q = wl._lognormal(rng, self.question_tokens, 0.3)
            tail = _ids(10**9 + n, 1 + q // bt)
            prompt = self.prefix_tokens + q
            out.append(TraceRequest(t, prompt, wl._lognormal(rng, self.output_tokens, 0.3), (*heads[g], *tail)))
            n += 1
        return out, warm_end


@dataclass(frozen=True)
class Private:
    """Long private prefixes: each session's document is asked about once, or twice (`again` of them)
    after a pause of about `gap_s`; nothing is shared between sessions."""

    rate: float
    duration_s: float
    prefix_tokens: int = 49_152
    again: float = 0.5
    gap_s: float = 60.0
    question_tokens: int = 256
    output_tokens: int = 256
    seed: int = 0

    def trace(self) -> list[TraceRequest]:
        rng = random.Random(self.seed)
        bt = BLOCK_TOKENS
        out: list[TraceRequest] = []
        t, n = 0.0, 0
        # sessions start at rate / (1 + again) so that requests, second asks included, arrive at `rate`
        while True:
            t += rng.expovariate(self.rate / (1 + self.again))
            if t >= self.duration_s:
                break
            head = _ids(3_000_000 + n, self.prefix_tokens // bt)
            asks = [t]
            if rng.random() < self.again:
                asks.append(t + rng.uniform(0.25, 1.75) * self.gap_s)
            for k, at in enumerate(asks):
                q = wl._lognormal(rng, self.question_tokens, 0.3)
                tail = _ids(2 * 10**9 + n * 4 + k, 1 + q // bt)
                out.append(
                    TraceRequest(
                        at, self.prefix_tokens + q, wl._lognormal(rng, self.output_tokens, 0.3), (*head, *tail)
                    )
                )
            n += 1
        return sorted(out, key=lambda r: r.arrival)


@dataclass(frozen=True)
class Chat:
    """Multi-turn chat with a growing history (bench/cache/workloads.py's chat generator)."""

    rate: float
    duration_s: float
    system_tokens: int = 4_000
    turns: float = 8.0
    think_s: float = 30.0
    user_tokens: int = 1_500
    answer_tokens: int = 400
    seed: int = 0

    def trace(self) -> list[TraceRequest]:
        shape = wl.Shape(rate=self.rate, duration=self.duration_s, block_tokens=BLOCK_TOKENS, seed=self.seed)
        return wl.chat(
            shape, systems=8, system_tokens=self.system_tokens, turns=self.turns, think_s=self.think_s,
            user_tokens=self.user_tokens, answer_tokens=self.answer_tokens,
        )  # fmt: skip
