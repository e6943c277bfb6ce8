"""One simulated vLLM replica: continuous batching under a token budget, prefix cache, KV capacity."""

from __future__ import annotations

import heapq
from collections import deque

from xpyd_router.kv.tier_cost import HOST_LINK_EFFICIENCY
from xpyd_sim.cache import CpuTier, PrefixCache
from xpyd_sim.metrics import Histogram
from xpyd_sim.ports import Perf
from xpyd_sim.request import SimRequest


class Worker:
    """A replica that prefills in chunks and decodes in multi-step segments cut short by new work.

    Decode runs as one event per segment (until the next sequence finishes), not one per token;
    a request arriving mid-segment joins at the next step boundary, as in vLLM's scheduler.

    A data-parallel replica (`ranks` D > 1: one vLLM API server over D engines) keeps one prefix
    cache per rank, each in 1/D of the replica's KV (a prompt cached on rank 3 does not hit on rank
    5), and counts each rank's waiting and running requests, which its API server balances on
    (`pick_rank`). Its steps stay priced as one engine over all ranks (PoolPerf), so only the
    cache a request meets depends on its rank.

    With a CPU tier (`cpu_blocks`, KV offloading) the blocks each rank's cache evicts move to host
    memory (`CpuTier`); a prompt whose prefix continues there past the GPU-held part reloads those
    blocks over the host link (`GpuSpec.host_bandwidth` per GPU, one reload after another on the
    replica's links) instead of computing them, and its prefill waits for the reload (as vLLM's
    offloading connector holds a request until its KV is loaded): the reload is part of its TTFT.
    """

    __slots__ = (
        "_chunks",
        "_idle_wait",
        "_joined",
        "assigned",
        "block_tokens",
        "born",
        "busy_s",
        "cache",
        "caches",
        "ctx",
        "died",
        "domain",
        "end",
        "gpus",
        "host_free",
        "host_rate",
        "index",
        "kv_cap",
        "kv_used",
        "max_seqs",
        "name",
        "nic_in",
        "nic_out",
        "pending",
        "perf",
        "prefilling",
        "rank_busy",
        "rank_cap",
        "rank_kv",
        "rank_queued",
        "ranks",
        "reloaded",
        "role",
        "routed",
        "running",
        "seg_dt",
        "seg_k",
        "seg_start",
        "state",
        "stats",
        "steps",
        "tiers",
        "token_budget",
        "version",
        "waiting",
    )

    def __init__(
        self,
        index: int,
        role: str,
        domain: str,
        perf: Perf,
        *,
        gpus: int,
        block_tokens: int = 512,
        token_budget: int = 8192,
        max_seqs: int = 256,
        cache_tokens: int | None = None,
        ranks: int = 1,
        cpu_blocks: int = 0,
    ) -> None:
        self.index = index
        self.name = f"{role}-{index}"
        self.role = role  # "prefill", "decode" or "worker" (co-located)
        self.domain = domain
        self.perf = perf
        self.gpus = gpus
        self.block_tokens = block_tokens
        self.token_budget = token_budget
        self.max_seqs = max_seqs
        self.kv_cap = perf.kv_capacity_tokens
        self.kv_used = 0
        # the prefix cache lives in the free KV blocks; `cache_tokens` caps it lower (a smaller cache)
        limit = self.kv_cap if cache_tokens is None else min(self.kv_cap, cache_tokens)
        self.ranks = max(1, ranks)
        # the CPU tier of each rank (its share of the replica's host memory for KV), none without offloading
        self.tiers = [CpuTier(cpu_blocks // self.ranks) for _ in range(self.ranks)] if cpu_blocks > 0 else []
        self.caches = [
            PrefixCache(limit // self.ranks // block_tokens, self.tiers[r] if self.tiers else None)
            for r in range(self.ranks)
        ]
        # bytes/s the replica reloads KV from host memory at: every GPU's host link, each its shard
        self.host_rate = perf.host_bandwidth * HOST_LINK_EFFICIENCY * gpus if self.tiers else 0.0
        self.host_free = 0.0  # when the host links are free for the next reload
        self.reloaded = 0  # prompt tokens reloaded from the CPU tier instead of computed
        self._idle_wait = False  # the scheduled "step" only waits for a reload to finish
        self.cache = self.caches[0]  # the replica's cache when it has one rank
        self.rank_cap = self.kv_cap // self.ranks  # each rank's KV tokens
        self.rank_kv = [0] * self.ranks  # KV tokens held per rank (they sum to kv_used)
        self.rank_queued = [0] * self.ranks  # vllm:num_requests_waiting per rank (kept by admit / expect)
        self.rank_busy = [0] * self.ranks  # vllm:num_requests_running per rank
        self.waiting: deque[SimRequest] = deque()  # prompts to compute here
        self.pending: deque[SimRequest] = deque()  # handed-off requests waiting for a decode slot
        self.running: list[tuple[int, int, SimRequest]] = []  # (finish step, rid, request)
        self.steps = 0
        self.prefilling = 0  # requests of `waiting` whose prefill has started (vLLM counts them running)
        self.ctx = 0
        self.end = -1.0  # end of the scheduled step or segment; -1 when idle
        self.version = 0
        self.seg_start = self.seg_dt = 0.0
        self.seg_k = 0
        self._chunks: list[tuple[SimRequest, int]] = []
        self._joined: list[SimRequest] = []
        self.state = "ready"  # "starting", "ready", "draining", "gone"
        self.born = 0.0
        self.died = -1.0
        self.routed = 0
        self.assigned = 0  # requests the router planned here whose prefill runs elsewhere still
        self.nic_in = self.nic_out = 0.0  # when the worker's NICs are free for the next handoff
        # prompt tokens queried, hit in the prefix cache, computed; decode tokens emitted
        self.stats = [0, 0, 0, 0]
        self.busy_s = 0.0  # seconds of steps run (the engine's busy time)

    @property
    def idle(self) -> bool:
        return self.end < 0 and not self.waiting and not self.pending and not self.running

    @property
    def queued(self) -> int:
        """vllm:num_requests_waiting: requests not yet scheduled."""
        return len(self.waiting) - self.prefilling + len(self.pending)

    @property
    def busy(self) -> int:
        """vllm:num_requests_running: sequences being prefilled or decoded."""
        return len(self.running) + self.prefilling

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_cap if self.kv_cap else 1.0

    def release(self, tokens: int, rank: int = 0) -> None:
        """Free KV held on `rank` for a prompt whose cache has been handed to a decode worker."""
        self.kv_used -= tokens
        self.rank_kv[rank] -= tokens

    def pick_rank(self) -> int:
        """The rank vLLM's API server sends an unpinned request to: the lowest waiting * 4 + running,
        the first such from rank 0 (v1/engine/core_client.py DPLBAsyncMPClient, one API server)."""
        if self.ranks == 1:
            return 0
        queued, busy = self.rank_queued, self.rank_busy
        best, low = 0, queued[0] * 4 + busy[0]
        for r in range(1, self.ranks):
            score = queued[r] * 4 + busy[r]
            if score < low:
                best, low = r, score
        return best

    def admit(self, req: SimRequest) -> None:
        """A prompt to compute here joins the queue, on its pinned rank or the one the engine picks;
        a one-hop request decodes on the same rank."""
        if req.prefill_rank < 0:
            req.prefill_rank = self.pick_rank()
        if req.direct:
            req.decode_rank = req.prefill_rank
        self.rank_queued[req.prefill_rank] += 1
        self.waiting.append(req)

    def expect(self, req: SimRequest) -> None:
        """A prefilled request's decode hop arrives (it waits for its KV, as vLLM counts it: waiting):
        its rank is pinned or picked now; it joins `pending` when the KV is here."""
        if req.decode_rank < 0:
            req.decode_rank = self.pick_rank()
        self.rank_queued[req.decode_rank] += 1

    def _trim(self, rank: int) -> None:
        """Keep a rank's cache within its free KV blocks."""
        cache = self.caches[rank]
        cache.trim(min(cache.capacity, (self.rank_cap - self.rank_kv[rank]) // self.block_tokens))

    def _reload(self, req: SimRequest, blocks: int, now: float) -> None:
        """The prompt's next `blocks` blocks are in host memory: reload them (after the reloads ahead)
        instead of computing them; the prefill waits for them (`req.ready`)."""
        tokens = min(blocks * self.block_tokens, req.prompt_tokens - 1 - req.cached_tokens)
        if tokens <= 0 or self.host_rate <= 0:
            return
        start = max(now, self.host_free)
        req.ready = self.host_free = start + tokens * self.perf.kv_bytes_per_token / self.host_rate
        req.reloaded_tokens = tokens
        req.cached_tokens += tokens
        self.reloaded += tokens

    def interrupt(self, now: float) -> float:
        """Cut a decode segment at the next step boundary so new work joins; new end or -1."""
        if self._idle_wait and self.end > now:  # only waiting for a reload: plan again now
            self.seg_dt = now - self.seg_start
            self.end = now
            self.version += 1
            return now
        if self.end < 0 or self.seg_k <= 1:
            return -1.0
        done = int((now - self.seg_start) / self.seg_dt) + 1
        if done >= self.seg_k:
            return -1.0
        self.seg_k = done
        self.end = self.seg_start + done * self.seg_dt
        self.version += 1
        return self.end

    def plan(self, now: float) -> float:
        """Schedule the next step from the queues; returns its end time, or -1 when idle."""
        perf = self.perf
        running = self.running
        while self.pending and len(running) < self.max_seqs:
            req = self.pending[0]
            if self.kv_used + req.prompt_tokens + req.output_tokens > self.kv_cap and running:
                break
            self.pending.popleft()
            rank = req.decode_rank if req.decode_rank >= 0 else 0
            req.kv_reserved = req.prompt_tokens + req.output_tokens
            self.kv_used += req.kv_reserved
            self.rank_kv[rank] += req.kv_reserved
            self.rank_queued[rank] -= 1
            self.rank_busy[rank] += 1
            heapq.heappush(running, (self.steps + req.output_tokens, req.rid, req))
            self.ctx += req.prompt_tokens
            self._joined.append(req)
            self.caches[rank].insert(req.blocks)  # the received KV stays as this rank's prefix cache
            if self.ranks > 1:
                self._trim(rank)
        chunks = self._chunks
        budget = self.token_budget - len(running)
        priced: list[tuple[int, int]] = []
        wake = -1.0  # the first reload still under way: the step must end by then
        for req in self.waiting:
            if budget <= 0:
                break
            if req.ready > now:  # its KV is still on its way from host memory: the others go on
                wake = req.ready if wake < 0 else min(wake, req.ready)
                continue
            if req.prefill_start < 0:
                reserve = req.prompt_tokens + (req.output_tokens if req.direct else 0)
                if self.kv_used + reserve > self.kv_cap and (running or chunks or self.kv_used):
                    break
                if req.direct and len(running) + len(chunks) >= self.max_seqs:
                    break
                rank = req.prefill_rank if req.prefill_rank >= 0 else 0
                req.kv_reserved = reserve
                self.kv_used += reserve
                self.rank_kv[rank] += reserve
                self.rank_queued[rank] -= 1
                self.rank_busy[rank] += 1
                self._trim(rank)
                cache = self.caches[rank]
                held = cache.match(req.blocks)
                req.cached_tokens = min(held * self.block_tokens, req.prompt_tokens - 1)
                if cache.spill is not None:
                    self._reload(req, cache.spill.run(req.blocks, held), now)
                req.prefill_done = req.cached_tokens
                req.prefill_start = now
                self.prefilling += 1
                self.stats[0] += req.prompt_tokens
                self.stats[1] += req.cached_tokens
                if req.ready > now:
                    wake = req.ready if wake < 0 else min(wake, req.ready)
                    continue
            chunk = min(req.prompt_tokens - req.prefill_done, budget)
            # vLLM caches the full blocks a step will compute when it schedules them (allocate_slots ->
            # cache_blocks), so a prompt scheduled after this one hits them, even before they are done
            full = min(len(req.blocks), (req.prefill_done + chunk) // self.block_tokens)
            if full > req.prefill_done // self.block_tokens:
                self.caches[req.prefill_rank if req.prefill_rank >= 0 else 0].insert(req.blocks[:full])
            priced.append((chunk, req.prefill_done))
            chunks.append((req, chunk))
            budget -= chunk
        self._idle_wait = False
        if chunks:
            k = 1
            dt = perf.step_seconds(priced, len(running), self.ctx)
        elif running:
            k = running[0][0] - self.steps
            dt = perf.decode_step_seconds(len(running), self.ctx + len(running) * (k - 1) // 2)
            if wake > now:  # end the segment at the step a reload finishes in, so its prefill starts
                k = max(1, min(k, -int(-(wake - now) // dt)))
        elif wake > now:  # nothing to run until a reload finishes
            k, dt = 1, wake - now
            self._idle_wait = True
        else:
            self.end = -1.0
            return -1.0
        for req in self._joined:
            req.first_token = now + dt
        self.seg_start, self.seg_dt, self.seg_k = now, dt, k
        self.end = now + dt * k
        self.version += 1
        return self.end

    def complete(
        self,
        now: float,
        itl: Histogram,
        handoffs: list[SimRequest],
        done: list[SimRequest],
        started: list[SimRequest] | None = None,
    ) -> None:
        """Apply the step or segment ending now: tokens, finished sequences, finished prompts (the ones
        computed here for their own answer, which now have a first token, are added to `started`)."""
        running = self.running
        k, batch = self.seg_k, len(running)
        if not self._idle_wait:
            self.busy_s += self.seg_dt * k
        if batch:
            self.steps += k
            self.ctx += batch * k
            tokens = batch * k
            self.stats[3] += tokens
            if tokens > len(self._joined):
                itl.add(self.seg_dt, tokens - len(self._joined))
            while running and running[0][0] <= self.steps:
                req = heapq.heappop(running)[2]
                req.finished = now
                rank = req.decode_rank if req.decode_rank >= 0 else 0
                self.kv_used -= req.kv_reserved
                self.rank_kv[rank] -= req.kv_reserved
                self.rank_busy[rank] -= 1
                self.ctx -= req.prompt_tokens + req.output_tokens
                done.append(req)
        self._joined.clear()
        for req, chunk in self._chunks:
            req.prefill_done += chunk
            self.stats[2] += chunk
            if req.prefill_done < req.prompt_tokens:
                continue
            if self.waiting[0] is req:
                self.waiting.popleft()
            else:  # a request ahead of it waits for a reload
                self.waiting.remove(req)
            self.prefilling -= 1
            req.prefill_end = now
            rank = req.prefill_rank if req.prefill_rank >= 0 else 0
            self.caches[rank].insert(req.blocks)
            if self.ranks > 1:
                self._trim(rank)
            if not req.direct:
                self.rank_busy[rank] -= 1
                handoffs.append(req)
                continue
            req.first_token = now
            if started is not None:
                started.append(req)
            if req.output_tokens == 1:
                req.finished = now
                self.kv_used -= req.kv_reserved
                self.rank_kv[rank] -= req.kv_reserved
                self.rank_busy[rank] -= 1
                done.append(req)
            else:
                heapq.heappush(running, (self.steps + req.output_tokens - 1, req.rid, req))
                self.ctx += req.prompt_tokens + 1
        self._chunks.clear()
        if self.ranks == 1:
            self._trim(0)
        self.end = -1.0
