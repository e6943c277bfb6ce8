"""Continuous batching on a virtual clock: each step's duration comes from the performance model.

Every step schedules one token per decoding sequence, then prefill chunks of running and newly
admitted sequences, all under a per-step token budget (--max-num-batched-tokens) and a sequence
cap (--max-num-seqs); sequences that do not fit wait, which is what `vllm:num_requests_waiting`
shows. A sequence reserves KV blocks for prompt + max_tokens when admitted. The step then sleeps
its modelled time divided by the speed-up, on a deadline so timer granularity does not drift.
An abort takes a sequence out of the queues at once, so the running/waiting gauges are exact.

A vLLM data-parallel replica of D ranks is D engines (vllm/v1/engine/core.py, one EngineCore per
rank), each with its own scheduler, budgets and KV cache. The emulator steps them together (the
ranks of a wide replica run in lockstep, the busiest setting the pace) but keeps each sequence on
one rank: its prefix cache, its blocks, its per-rank token budget (--max-num-batched-tokens) and
sequence cap (--max-num-seqs), its gauges and counters. A rank whose next waiting sequence cannot
get blocks stops admitting; the other ranks go on (each vLLM scheduler is first come, first
served on its own). `pick_rank` is vLLM's internal load balancer over the per-rank counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

from xpyd_emulator.dp_routing import least_loaded
from xpyd_emulator.metrics import EngineMetrics
from xpyd_emulator.prefix_cache import BlockPool, KvEvent
from xpyd_perf import GpuSpec, ModelSpec, attention_flops, step_seconds
from xpyd_perf.timing import group_step_seconds
from xpyd_perf.topology import Parallelism


class Sequence:
    """One request inside the engine; the HTTP handler waits on `event` for new tokens."""

    __slots__ = ("aborted", "arrival", "blocks", "cached", "computed", "done", "event", "first_at",
                 "generated", "hashes", "hold", "last_at", "lease", "matched", "max_tokens", "on_done", "prompt",
                 "rank", "ready_at", "reloaded", "streamed", "tokens")  # fmt: skip

    def __init__(
        self,
        prompt: int,
        hashes: list[int],
        max_tokens: int,
        arrival: float,
        *,
        computed: int | None = None,
        hold: bool = False,
        streamed: bool = True,
        rank: int = 0,
    ) -> None:
        self.prompt = prompt
        self.hashes = hashes
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.rank = rank  # the data-parallel rank (engine) that serves it
        self.hold = hold  # keep the blocks pinned when done (a lease takes them over)
        self.streamed = streamed  # wake the handler on every token, else only when done
        self.matched = computed is not None  # prefix already resolved (remote prefill)
        self.computed = computed or 0
        self.cached = self.computed
        self.generated = 0
        self.blocks = 0
        self.first_at = 0.0
        self.last_at = 0.0
        self.done = False
        self.aborted = False
        self.event = asyncio.Event()
        self.on_done: Callable[[], None] | None = None  # called once when the last token is out
        self.lease: int | None = None  # first block id of the KV lease that took over `blocks`
        self.tokens: Any = None  # the prompt's token ids, when KV events report stored blocks
        self.reloaded = 0  # prompt tokens loaded back from the CPU tier instead of recomputed
        self.ready_at = 0.0  # loop time its reload from the CPU tier is done (it waits until then)


class Engine:
    """The scheduler of one emulated vLLM engine."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        tp: int,
        pool: BlockPool,
        metrics: EngineMetrics | list[EngineMetrics],
        *,
        speedup: float = 1.0,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        parallel: Parallelism | None = None,
        rank_budget: int | None = None,
        rank_max_seqs: int | None = None,
        reload_bytes_per_s: float = 0.0,
    ) -> None:
        self.model, self.gpu, self.tp, self.pool = model, gpu, tp, pool
        # host -> GPU rate of a reload from the CPU tier, the replica's GPUs together (0: no CPU tier)
        self.reload_bytes_per_s = reload_bytes_per_s
        self.ranks = pool.ranks  # data-parallel ranks kept apart (1: one engine, or SGLang's whole replica)
        self.rank_metrics = metrics if isinstance(metrics, list) else [metrics]
        if len(self.rank_metrics) != self.ranks:
            raise ValueError(f"{len(self.rank_metrics)} engines' metrics for a pool of {self.ranks} ranks")
        self.metrics = self.rank_metrics[0]
        self.parallel = parallel  # a data/expert-parallel replica (all its ranks as one engine); None: plain TP
        self.speedup = speedup
        self.budget = max_num_batched_tokens
        self.rank_budget = rank_budget or max_num_batched_tokens  # one sequence's chunk: one rank's budget
        self.max_seqs = max_num_seqs
        self.rank_max_seqs = rank_max_seqs or max(1, max_num_seqs // self.ranks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.waiting_on = [0] * self.ranks  # per rank: queued sequences
        self.running_on = [0] * self.ranks  # per rank: scheduled sequences
        self.pulling = [0] * self.ranks  # per rank: decodes fetching remote KV (vLLM counts them as waiting)
        self.progress = 0.0  # loop time of the last step, or of the last moment with nothing to do
        self._wake = asyncio.Event()
        self._deadline = 0.0
        self._attn_coef = 4.0 * model.layers * model.q_heads * model.attn_head_dim
        # A step's KV events of one rank, (rank, events): vLLM's schedulers publish per step, per rank.
        self.on_events: Callable[[int, list[KvEvent]], None] | None = None

    def flush_events(self) -> None:
        """Hand each rank's recorded KV events to its publisher, one batch per rank per step."""
        if self.on_events is None:
            return
        for rank in range(self.ranks):
            if events := self.pool.take_events(rank):
                self.on_events(rank, events)

    def gauges(self) -> None:
        """Refresh each rank's vllm:num_requests_running / _waiting / kv_cache_usage_perc from the queues."""
        for rank, m in enumerate(self.rank_metrics):
            m.running = self.running_on[rank]
            m.waiting = self.waiting_on[rank] + self.pulling[rank]
            m.kv_usage = self.pool.rank_usage(rank)

    def pick_rank(self) -> int:
        """The rank vLLM's internal load balancer sends a request without a rank to."""
        if self.ranks == 1:
            return 0
        waiting = [w + p for w, p in zip(self.waiting_on, self.pulling, strict=True)]
        return least_loaded(waiting, self.running_on)

    def submit(self, seq: Sequence) -> None:
        if not self.running and not self.waiting:  # work starts now: the stall clock too
            self.progress = asyncio.get_running_loop().time()
        self.waiting.append(seq)
        self.waiting_on[seq.rank] += 1
        self.gauges()
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away, at once: out of the queues, its blocks freed."""
        if seq.done:
            return
        seq.aborted = seq.done = True
        if seq in self.running:
            self.running.remove(seq)
            self.running_on[seq.rank] -= 1
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.waiting_on[seq.rank] -= 1
        self.pool.unpin(seq.blocks, seq.rank)
        seq.blocks = 0
        self.rank_metrics[seq.rank].success["abort"] += 1
        seq.event.set()
        self.gauges()
        self._wake.set()

    def fail_all(self) -> None:
        """The loop stopped: end every queued and running sequence so no handler waits forever."""
        for seq in [*self.running, *self.waiting]:
            self.abort(seq)

    def stalled(self, now: float, limit: float) -> bool:
        """Work is queued but no step ran for `limit` seconds (blocks that never free, a stuck loop)."""
        return bool(self.running or self.waiting) and now - self.progress > limit

    def _match(self, seq: Sequence, now: float = 0.0) -> None:
        """Find the prompt's cached prefix: GPU-held blocks, then the run its CPU tier holds after them,
        which the engine loads back over the host link (the sequence waits `ready_at` for it) instead
        of recomputing it, as vLLM's OffloadingConnector loads what its lookup found."""
        pool = self.pool
        hits = pool.match(seq.hashes, seq.rank)
        gpu = min(hits * pool.block_size, seq.prompt - 1)
        reload = pool.reload(seq.hashes, hits, seq.rank) if self.reload_bytes_per_s > 0 else 0
        seq.cached = seq.computed = min((hits + reload) * pool.block_size, seq.prompt - 1)
        seq.reloaded = seq.cached - gpu
        if seq.reloaded > 0:
            seconds = seq.reloaded * self.model.kv_bytes_per_token / self.reload_bytes_per_s
            seq.ready_at = now + seconds / self.speedup
        seq.matched = True
        m = self.rank_metrics[seq.rank]
        m.prefix_queries += seq.prompt
        m.prefix_hits += gpu  # vLLM's prefix-cache counters: the GPU's own hits
        m.offload_hits += seq.reloaded

    def instant(self, seq: Sequence, now: float) -> None:
        """Zero-delay mode: account a whole request at once (prefix cache, metrics), no scheduling."""
        if not seq.matched:
            self._match(seq)
        self.pool.insert(seq.hashes, seq.tokens, seq.rank)
        self.flush_events()
        if seq.hold:
            seq.blocks = self.pool.blocks_for(seq.prompt)
            self.pool.pin(seq.blocks, seq.rank)
        m = self.rank_metrics[seq.rank]
        m.prompt_tokens += seq.prompt
        m.generation_tokens += seq.max_tokens
        for hist, times in ((m.ttft, 1), (m.itl, seq.max_tokens - 1), (m.e2e, 1), (m.queue, 1)):
            hist.counts[0] += times  # zero latency: the first bucket
            hist.count += times
        seq.generated = seq.max_tokens
        seq.first_at = seq.last_at = now
        seq.done = True
        if seq.on_done is not None:
            seq.on_done()

    def _cache_scheduled(self, seq: Sequence, n: int) -> None:
        """Cache the full blocks this step computes for `seq` now, as vLLM does when it schedules
        them (`KVCacheManager.allocate_slots` -> `cache_blocks`, which also publishes their
        BlockStored event): a prompt scheduled after this one, in this step or a later one, hits
        them before this prompt's prefill is done."""
        size = self.pool.block_size
        full = min(len(seq.hashes), (seq.computed + n) // size)
        if full > seq.computed // size:
            self.pool.insert(seq.hashes[:full], seq.tokens, seq.rank)

    def schedule(self, now: float) -> tuple[list[Sequence], list[tuple[Sequence, int]], float]:
        """Pick this step's decodes and prefill chunks; returns them and the step's modelled time."""
        budget, largest = self.budget, 0
        # Data-parallel ranks: each has its own token budget (and sequence cap), as each vLLM
        # scheduler does; None with one rank, where the replica-wide budget is the whole story.
        left = [self.rank_budget] * self.ranks if self.ranks > 1 else None
        decodes: list[Sequence] = []
        chunks: list[tuple[Sequence, int]] = []
        attn = 0.0
        kv_read = 0
        for seq in self.running:
            if seq.computed >= seq.prompt:
                ctx = seq.prompt + seq.generated
                decodes.append(seq)
                attn += self._attn_coef * ctx
                kv_read += ctx
                budget -= 1
                if left is not None:
                    left[seq.rank] -= 1
            elif budget > 0 and (left is None or left[seq.rank] > 0):
                n = min(seq.prompt - seq.computed, budget, self.rank_budget if left is None else left[seq.rank])
                chunks.append((seq, n))
                self._cache_scheduled(seq, n)
                largest = max(largest, n)
                attn += attention_flops(self.model, seq.computed, seq.computed + n)
                kv_read += seq.computed + n
                budget -= n
                if left is not None:
                    left[seq.rank] -= n
        waiting, i = self.waiting, 0
        blocked: set[int] = set()  # ranks that admit nothing more this step
        while i < len(waiting) and budget > 0 and len(self.running) < self.max_seqs:
            seq = waiting[i]
            rank = seq.rank
            if rank in blocked:
                i += 1
                continue
            if left is not None and (left[rank] <= 0 or self.running_on[rank] >= self.rank_max_seqs):
                blocked.add(rank)
                if len(blocked) == self.ranks:
                    break
                i += 1
                continue
            if not seq.matched:
                self._match(seq, now)
            if seq.ready_at > now:  # its blocks are still loading from the CPU tier: the next ones go
                i += 1
                continue
            need = self.pool.blocks_for(seq.prompt + seq.max_tokens)
            if not self.pool.try_pin(need, rank):
                blocked.add(rank)  # this rank serves its queue in order: it waits for blocks
                if left is None or len(blocked) == self.ranks:
                    break
                i += 1
                continue
            if i == 0:
                waiting.popleft()
            else:
                del waiting[i]
            self.waiting_on[rank] -= 1
            self.running_on[rank] += 1
            seq.blocks = need
            self.running.append(seq)
            self.rank_metrics[rank].queue.observe(now - seq.arrival)
            n = min(seq.prompt - seq.computed, budget, self.rank_budget if left is None else left[rank])
            chunks.append((seq, n))
            self._cache_scheduled(seq, n)
            largest = max(largest, n)
            attn += attention_flops(self.model, seq.computed, seq.computed + n)
            kv_read += seq.computed + n
            budget -= n
            if left is not None:
                left[rank] -= n
        tokens = self.budget - budget
        if self.parallel is not None:  # a sequence lives on one data-parallel rank: the busiest sets the pace
            busiest = max(-(-tokens // max(1, self.parallel.dp)), largest)
            if left is not None:
                busiest = max(busiest, self.rank_budget - min(left))
            seconds = group_step_seconds(self.model, self.gpu, self.parallel, tokens=tokens, attn_flops=attn,
                                         kv_tokens_read=kv_read, busiest=busiest)  # fmt: skip
        else:
            seconds = step_seconds(
                self.model, self.gpu, tp=self.tp, tokens=tokens, attn_flops=attn, kv_tokens_read=kv_read
            )
        return decodes, chunks, seconds

    def apply(self, decodes: list[Sequence], chunks: list[tuple[Sequence, int]], now: float) -> None:
        by_rank = self.rank_metrics
        finished = False
        for seq, n in chunks:
            if seq.aborted:  # aborted while its step ran
                continue
            seq.computed += n
            if seq.computed >= seq.prompt:
                m = by_rank[seq.rank]
                self.pool.insert(seq.hashes, seq.tokens, seq.rank)
                m.prompt_tokens += seq.prompt
                m.ttft.observe(now - seq.arrival)
                seq.first_at = seq.last_at = now
                seq.generated = 1
                m.generation_tokens += 1
                finished |= self._finish_if_done(seq, now)
        for seq in decodes:
            if seq.aborted:
                continue
            m = by_rank[seq.rank]
            seq.generated += 1
            m.generation_tokens += 1
            m.itl.observe(now - seq.last_at)
            seq.last_at = now
            finished |= self._finish_if_done(seq, now)
        if finished:
            self.running = [s for s in self.running if not s.done]
        self.flush_events()
        self.progress = now
        self.gauges()

    def _finish_if_done(self, seq: Sequence, now: float) -> bool:
        if seq.generated < seq.max_tokens:
            if seq.streamed:
                seq.event.set()
            return False
        seq.event.set()
        seq.done = True
        self.running_on[seq.rank] -= 1
        if not seq.hold:
            self.pool.unpin(seq.blocks, seq.rank)
        else:  # keep only the prompt's blocks for the lease
            keep = self.pool.blocks_for(seq.prompt)
            self.pool.unpin(seq.blocks - keep, seq.rank)
            seq.blocks = keep
        self.rank_metrics[seq.rank].e2e.observe(now - seq.arrival)
        self.rank_metrics[seq.rank].prompt_length.observe(seq.prompt)
        if seq.on_done is not None:
            seq.on_done()
        return True

    def _idle_wait(self, now: float) -> float:
        """How long an idle step waits: until the first reload from the CPU tier is done, at most 50 ms."""
        loading = [seq.ready_at - now for seq in self.waiting if seq.ready_at > now]
        return max(0.001, min([0.05, *loading]))

    async def _sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = max(self._deadline, loop.time() - 0.05) + seconds
        delay = self._deadline - loop.time()
        await asyncio.sleep(delay if delay > 0.0005 else 0)

    async def run(self) -> None:
        """The step loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        self._deadline = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                self.gauges()
                await self._wake.wait()
                self._deadline = self.progress = loop.time()
            decodes, chunks, seconds = self.schedule(loop.time())
            if not decodes and not chunks:  # waiting for blocks that never free, or for reloads: yield
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._idle_wait(loop.time()))
                continue
            await self._sleep(seconds / self.speedup)
            self.apply(decodes, chunks, loop.time())
