"""The discrete-event loop: arrivals, engine steps, KV handoffs, scrapes and autoscaler ticks on one heap."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator

from xpyd_router.kv.tier_cost import ReloadCost
from xpyd_router.model import NoWorker
from xpyd_sim.cluster import Cluster
from xpyd_sim.config import SimConfig
from xpyd_sim.metrics import Collector, Histogram
from xpyd_sim.perfmodel import Links, PoolPerf, group_parallelism
from xpyd_sim.request import SimRequest
from xpyd_sim.routing import SimRouter
from xpyd_sim.scaling import SimScaler
from xpyd_sim.spec import SimSpec
from xpyd_sim.trace import TraceRequest
from xpyd_sim.worker import Worker

ARRIVAL, STEP, KV_READY, SCRAPE, TICK, SAMPLE, UP, KV_EVENTS, PEERS = range(9)
__all__ = ["SimConfig", "Simulation"]


class Simulation:
    """One run of a spec over a trace; `run()` returns the collector with everything measured."""

    def __init__(self, spec: SimSpec, trace: Iterable[TraceRequest], config: SimConfig | None = None) -> None:
        self.spec = spec
        self.cfg = cfg = config or SimConfig()
        self.perfs = {
            role: PoolPerf(
                spec.model, spec.topology.gpu, p.tp, p.gpus, spec.kv_bytes_per_token, p.expert_parallel,
                group_parallelism(spec.topology, role, p.tp, p.gpus, p.expert_parallel),
            )
            for role, p in spec.pools.items()
        }  # fmt: skip
        self.links = Links(spec.topology)
        first = "worker" if spec.mode == "Colocated" else "prefill"
        self.cluster = Cluster(
            spec,
            self.perfs,
            token_budget=cfg.token_budget,
            max_seqs=cfg.max_seqs,
            block_tokens=cfg.block_tokens,
            cache_tokens=cfg.cache_tokens,
            offload_tokens={role: self._offload_tokens(role) for role in spec.pools},
        )
        perf = self.perfs[first]
        pricing = ReloadCost(spec.model, spec.topology.gpu, perf.gpus, perf.kv_bytes_per_token)
        replicas = max(1, spec.deployment.router.replicas) if cfg.router_replicas is None else cfg.router_replicas
        self.router = SimRouter(
            cfg.router,
            cfg.block_tokens,
            replicas,
            cfg.router_index,
            cfg.event_delay_s,
            cfg.dp_routing,
            share_routes=cfg.peer_sync_s > 0,
            pricing=pricing if cfg.tier_pricing else None,
            cpu_weight=cfg.cpu_block_weight,
        )
        self.router.set_workers(self.cluster.all_workers())
        self.first_role = first
        self.scaler = SimScaler(cfg.autoscaler, self.cluster, cfg.slo, dict(cfg.autoscaler_targets))
        self.metrics = Collector(slo=cfg.slo)
        self.itl = {role: Histogram() for role in spec.pools}
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._trace: Iterator[TraceRequest] = iter(trace)
        self.now = 0.0
        self.arrived = self.inflight = self.rejected = self.events = 0
        self.rerouted = 0
        self.prefill_work: dict[int, int] = {}  # request id -> the work its prefill hop counts in the router
        self.last_arrival = 0.0
        self.end_time = 0.0  # when the last request finished
        self._arrivals_left = False
        self.on_finish: Callable[[SimRequest], None] | None = None
        self.progress: Callable[[Simulation], None] | None = None

    def _offload_tokens(self, role: str) -> int:
        """A replica's CPU KV tier in tokens: the spec pool's, else the run's (pools that compute prompts)."""
        plan = self.spec.pools[role]
        size = plan.offload_bytes
        if not size and (role != "decode" or self.cfg.offload_decode):
            size = self.cfg.offload_bytes
        return size // self.perfs[role].kv_bytes_per_token if size > 0 else 0

    def _push(self, t: float, kind: int, obj: object = None, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj, version))

    def _next_arrival(self) -> None:
        cfg = self.cfg
        self._arrivals_left = False
        if cfg.max_requests is not None and self.arrived >= cfg.max_requests:
            return
        nxt = next(self._trace, None)
        if nxt is None or (cfg.duration_s is not None and nxt.arrival > cfg.duration_s):
            return
        self._arrivals_left = True
        self._push(max(nxt.arrival, self.now), ARRIVAL, nxt)

    def run(self) -> Collector:
        cfg = self.cfg
        self._next_arrival()
        self._push(cfg.scrape_s, SCRAPE)
        self._push(0.0, SAMPLE)
        if cfg.peer_sync_s > 0 and len(self.router.pools) > 1:
            self._push(cfg.peer_sync_s, PEERS)
        if self.scaler.name != "off":
            self._push(cfg.interval_s or self.spec.interval_s, TICK)
        heap = self._heap
        pop = heapq.heappop
        step, arrival, kv_ready = self._step, self._arrival, self._kv_ready
        while heap:
            t, _, kind, obj, version = pop(heap)
            if t < self.now:
                raise AssertionError(f"event of kind {kind} at {t} before now {self.now}")
            self.now = self.router.now = t
            self.events += 1
            if kind == STEP:
                assert isinstance(obj, Worker)
                if version == obj.version:
                    step(obj, t)
            elif kind == ARRIVAL:
                assert isinstance(obj, TraceRequest)
                arrival(obj, t)
            elif kind == KV_READY:
                assert isinstance(obj, SimRequest)
                kv_ready(obj, t)
            else:
                self._periodic(kind, obj, t)
            if self.progress is not None and not self.events & 4095:
                self.progress(self)
        for w in self.cluster.all_workers():
            assert w.idle, f"{w.name} still busy at the end"
        return self.metrics

    def _periodic(self, kind: int, obj: object, t: float) -> None:
        more = self.inflight > 0 or self._arrivals_left
        cfg = self.cfg
        if kind == SCRAPE:
            self.router.scrape()
            if more:
                self._push(t + cfg.scrape_s, SCRAPE)
        elif kind == SAMPLE:
            self._sample(t)
            if more:
                self._push(t + cfg.sample_s, SAMPLE)
        elif kind == TICK:
            self._autoscale(t)
            if more:
                self._push(t + (cfg.interval_s or self.spec.interval_s), TICK)
        elif kind == KV_EVENTS and self.router.bus is not None:
            due = self.router.bus.deliver(t)
            if due is not None:
                self._push(due, KV_EVENTS)
        elif kind == PEERS:
            self.router.share_load()
            if more:
                self._push(t + cfg.peer_sync_s, PEERS)
        elif kind == UP:
            assert isinstance(obj, Worker)
            if obj.state == "starting":
                obj.state = "ready"
                self.router.set_workers(self.cluster.all_workers())

    def _kick(self, w: Worker, now: float) -> None:
        end = w.plan(now) if w.end < 0 else w.interrupt(now)
        if end >= 0:
            self._push(end, STEP, w, w.version)
        self._collect(w, now)

    def _collect(self, w: Worker, now: float) -> None:
        """The worker's cache changes become KV events on their way to the router replicas."""
        bus = self.router.bus
        if bus is not None and any(c.events for c in w.caches):
            due = bus.send(w, now)
            if due is not None:
                self._push(due, KV_EVENTS)

    def _arrival(self, tr: TraceRequest, now: float) -> None:
        self.arrived += 1
        self.last_arrival = now
        self._next_arrival()
        req = SimRequest(self.arrived - 1, now, tr.prompt_tokens, tr.output_tokens, tr.blocks)
        try:
            prefill, decode, work = self.router.route(req)
        except NoWorker:
            self.rejected += 1
            return
        self.inflight += 1
        req.decode_worker = decode
        decode.routed += prefill is None
        self.prefill_work[req.rid] = work
        if prefill is None:
            req.direct = True
            req.prefill_worker = decode
            target = decode
        else:
            req.prefill_worker = prefill
            prefill.routed += 1
            decode.assigned += 1
            target = prefill
        target.admit(req)
        self._kick(target, now)

    def _step(self, w: Worker, now: float) -> None:
        handoffs: list[SimRequest] = []
        done: list[SimRequest] = []
        started: list[SimRequest] = []
        w.complete(now, self.itl[w.role], handoffs, done, started)
        for req in started:
            self.router.first_token(req, self.prefill_work.pop(req.rid, 0))
        for req in done:
            self._finish(req)
        for req in handoffs:
            self._handoff(req, w, now)
        end = w.plan(now)
        self._collect(w, now)
        if end >= 0:
            self._push(end, STEP, w, w.version)
        elif w.state == "draining" and w.idle and not w.assigned:
            self._retire(w, now)

    def _finish(self, req: SimRequest) -> None:
        self.inflight -= 1
        self.end_time = req.finished
        self.metrics.finish(req)
        self.router.finished(req)
        if req.direct:  # the worker that computed the prompt reports this TTFT
            role = "worker" if self.spec.mode == "Colocated" else "decode"
            self.scaler.ttft_window[role].append(req.first_token - req.arrival)
            self.scaler.prompt_window[role].append(req.prompt_tokens)
        if self.on_finish is not None:
            self.on_finish(req)

    def _handoff(self, req: SimRequest, src: Worker, now: float) -> None:
        self.scaler.ttft_window["prefill"].append(now - req.arrival)
        self.scaler.prompt_window["prefill"].append(req.prompt_tokens)
        self.router.prefill_done(req, self.prefill_work.pop(req.rid))
        dst = req.decode_worker
        assert dst is not None
        dst.assigned -= 1
        if dst.state not in ("ready", "draining"):  # planned decode worker left during the prefill
            self.rerouted += 1
            order = {"ready": 0, "draining": 1, "starting": 2}
            live = [w for w in self.cluster.workers["decode"] if w.state in order]
            dst = min(live, key=lambda w: (order[w.state], w.queued + w.busy, w.index))
            req.decode_worker = dst
            req.decode_rank = -1  # the new replica's API server picks the rank
        dst.expect(req)
        # only the blocks the decode rank does not hold already cross the link (as vLLM's NIXL pull)
        local = min(dst.caches[req.decode_rank].match(req.blocks) * dst.block_tokens, req.prompt_tokens - 1)
        tokens = req.prompt_tokens - local
        secs, path, nbytes = self.links.handoff(tokens, src.perf, dst.perf, src.domain, dst.domain)  # type: ignore[arg-type]
        start = now
        if path == "rdma":
            start = max(now, src.nic_out, dst.nic_in)
            src.nic_out = dst.nic_in = start + secs
        req.handoff_path = path
        req.handoff_bytes = nbytes
        self.metrics.handoff(path, nbytes)
        self._push(start + secs, KV_READY, req)

    def _kv_ready(self, req: SimRequest, now: float) -> None:
        src, dst = req.prefill_worker, req.decode_worker
        assert src is not None
        assert dst is not None
        src.release(req.kv_reserved, req.prefill_rank)
        req.kv_reserved = 0
        if src.state == "draining" and src.idle and not src.assigned:
            self._retire(src, now)
        dst.pending.append(req)
        self._kick(dst, now)

    def _retire(self, w: Worker, now: float) -> None:
        if w.kv_used > 0:  # a prompt's KV still on its way out
            return
        self.cluster.retire(w, now)
        self.router.set_workers(self.cluster.all_workers())

    def _sample(self, now: float) -> None:
        c = self.cluster
        pools = c.spec.pools
        queued = sum(w.queued for ws in c.workers.values() for w in ws)
        running = sum(w.busy for ws in c.workers.values() for w in ws)
        if "worker" in pools:
            self.metrics.sample(now, c.replicas("worker"), 0, queued, running)
        else:
            self.metrics.sample(now, c.replicas("prefill"), c.replicas("decode"), queued, running)

    def _autoscale(self, now: float) -> None:
        for role, (desired, reason) in self.scaler.decide(now, self.itl).items():
            have = self.cluster.replicas(role)
            if desired > have:
                for _ in range(desired - have):
                    w = self.cluster.add(role, now, ready=False)
                    self._push(now + self.cfg.startup_s, UP, w)
            elif desired < have:
                self._shrink(role, have - desired, now)
            if desired != have:
                self.metrics.scale_events.append((now, role, desired, reason))
        self.router.set_workers(self.cluster.all_workers())

    def _shrink(self, role: str, n: int, now: float) -> None:
        """Cancel starting replicas first, then drain the least busy ready ones."""
        ws = self.cluster.workers[role]
        victims = [w for w in ws if w.state == "starting"][::-1]
        victims += sorted((w for w in ws if w.state == "ready"), key=lambda w: (w.queued + w.busy, -w.index))
        for w in victims[:n]:
            if w.state == "starting":
                self.cluster.retire(w, now)
                continue
            w.state = "draining"
            if w.idle and not w.assigned and w.kv_used == 0:
                self.cluster.retire(w, now)
