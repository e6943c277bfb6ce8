"""The engine's parallel layout, its KV capacity, and this pod's rank in a multi-node replica, from its flags.

vLLM (v0.11.0): data/expert parallel over nodes with `--data-parallel-size D --data-parallel-size-local
L --data-parallel-address LEADER --data-parallel-rpc-port P`, the other nodes `--headless
--data-parallel-start-rank i*L`; a non-headless pod with a start rank > 0, `--data-parallel-hybrid-lb`
or `--data-parallel-rank` serves its own ranks (hybrid / external load balancing) and is modelled
alone. vLLM >= 0.11.1: tensor/pipeline parallel over nodes with `--nnodes N --node-rank i
--master-addr LEADER --master-port P`, `--headless` on i > 0; `--all2all-backend` (or the env
VLLM_ALL2ALL_BACKEND of 0.11.0). SGLang (0.5): `--nnodes N --node-rank i --dist-init-addr LEADER:P`,
node rank 0 serves HTTP; `--tp-size` is the world, `--dp-size` with `--enable-dp-attention` splits it,
`--ep-size` / `--moe-a2a-backend deepep --deepep-mode` pick expert parallel and its kernels.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpyd_emulator.errors import CommandLineError
from xpyd_perf import ModelSpec
from xpyd_perf.topology import TOPOLOGIES, A2aKind, Parallelism

if TYPE_CHECKING:
    from xpyd_emulator.cmdline import EmulatorConfig

VLLM_MASTER_PORT = 29501  # vLLM's --master-port default (0.11.1)
VLLM_RPC_PORT = 29550  # vLLM's --data-parallel-rpc-port default
# vLLM's --all2all-backend choices (0.33 config/parallel.py All2AllBackend)
VLLM_ALL2ALL = ("naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "deepep_v2", "mori_high_throughput",
                "mori_low_latency", "moonep", "nixl_ep", "allgather_reducescatter", "flashinfer_all2allv",
                "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided", "passthrough")  # fmt: skip


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """This pod's place in its replica: nodes in the group, its rank, the leader's rank port."""

    nodes: int = 1
    rank: int = 0
    leader_host: str = ""
    leader_port: int = 0

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def api(self) -> bool:
        """Whether this pod serves the engine's HTTP API (the leader, or a pod on its own)."""
        return self.rank == 0


@dataclass(frozen=True, slots=True)
class Layout:
    """What the timings model: attention tp x pp per data-parallel rank, dp ranks, experts over all."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    a2a: A2aKind = "high_throughput"
    overlap: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def parallelism(self, domain_gpus: int) -> Parallelism:
        return Parallelism(self.tp, self.pp, self.dp, self.expert_parallel, domain_gpus, self.a2a, self.overlap)


def domain_gpus(gpu: str) -> int:
    """GPUs of one NVLink domain on the system kind this GPU comes in (72 on GB200 racks, else 8)."""
    return max((t.domain_gpus for t in TOPOLOGIES.values() if t.gpu.name.lower() == gpu.lower()), default=8)


def add_flags(p: argparse.ArgumentParser, engine: str, count: Callable[[str], object],
              index: Callable[[str], object], port: Callable[[str], object]) -> None:  # fmt: skip
    """The parallel and multi-node flags of `engine` (count: >= 1, index: >= 0, port: 1..65535)."""
    p.add_argument("--pipeline-parallel-size", "--pp-size", *(["-pp"] if engine == "vllm" else []), dest="pp",
                   type=count, default=1)  # fmt: skip
    p.add_argument("--nnodes", *(["-n"] if engine == "vllm" else []), dest="nnodes", type=count, default=1)
    p.add_argument("--node-rank", *(["-r"] if engine == "vllm" else []), dest="node_rank", type=index, default=0)
    if engine == "sglang":
        p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
        p.add_argument("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=count, default=1)
        p.add_argument("--moe-a2a-backend", choices=("none", "deepep"), default="none")
        p.add_argument("--deepep-mode", choices=("normal", "low_latency", "auto"), default="auto")
        p.add_argument("--enable-two-batch-overlap", dest="overlap", action="store_true")
        return
    p.add_argument("--data-parallel-size-local", "-dpl", dest="dp_local", type=count, default=None)
    p.add_argument("--data-parallel-start-rank", "-dpr", dest="dp_start", type=index, default=None)
    p.add_argument("--data-parallel-rank", "-dpn", dest="dp_rank", type=index, default=None)
    p.add_argument("--data-parallel-address", "-dpa", dest="dp_address", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", dest="dp_rpc_port", type=port, default=VLLM_RPC_PORT)
    p.add_argument("--data-parallel-hybrid-lb", dest="hybrid_lb", action="store_true")
    p.add_argument("--headless", action="store_true")
    p.add_argument("--api-server-count", "-asc", dest="api_servers", type=index, default=1)
    p.add_argument("--master-addr", dest="master_addr", default=None)
    p.add_argument("--master-port", dest="master_port", type=port, default=VLLM_MASTER_PORT)
    p.add_argument("--all2all-backend", dest="all2all", choices=VLLM_ALL2ALL, default=None)
    p.add_argument("--enable-dbo", dest="overlap", action="store_true")


def _host_port(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise CommandLineError(f"{flag} {text!r} is not HOST:PORT (e.g. leader.lws.ns:20000)")
    return host, int(port)


def _check_rank(rank: int, nodes: int, flag: str) -> None:
    if rank >= nodes:
        raise CommandLineError(f"{flag} {rank} is out of range for a group of {nodes} nodes (0..{nodes - 1})")


def _vllm(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[GroupPlan, Layout]:
    headless = ns.headless or ns.api_servers < 1
    backend = ns.all2all or env.get("VLLM_ALL2ALL_BACKEND") or "allgather_reducescatter"
    if backend not in VLLM_ALL2ALL:
        raise CommandLineError(f"env VLLM_ALL2ALL_BACKEND {backend!r} is not one of {', '.join(VLLM_ALL2ALL)}")
    a2a: A2aKind = "high_throughput" if backend.endswith("high_throughput") else "low_latency"
    dp = ns.dp
    plan = GroupPlan()
    if ns.nnodes > 1:
        if dp > 1:
            raise CommandLineError(
                "the emulator runs --nnodes for tensor/pipeline parallel only; spread data parallel over "
                "nodes with --data-parallel-size-local and --data-parallel-start-rank"
            )
        _check_rank(ns.node_rank, ns.nnodes, "--node-rank")
        if (ns.tp * ns.pp) % ns.nnodes:
            shape = f"tensor x pipeline parallel {ns.tp} x {ns.pp}"
            raise CommandLineError(f"{shape} does not split over --nnodes {ns.nnodes}")
        if (ns.node_rank > 0) != headless:
            raise CommandLineError("vLLM runs --node-rank > 0 with --headless and node rank 0 without it")
        plan = GroupPlan(ns.nnodes, ns.node_rank, ns.master_addr or "127.0.0.1", ns.master_port)
    elif ns.dp_rank is not None:  # external load balancing: one rank, its own API server
        dp = 1
    elif ns.dp_local is not None and ns.dp_local < dp:
        if dp % ns.dp_local:
            local = ns.dp_local
            raise CommandLineError(f"--data-parallel-size {dp} is not a multiple of --data-parallel-size-local {local}")
        start = ns.dp_start or 0
        if start % ns.dp_local or start >= dp:
            raise CommandLineError(
                f"--data-parallel-start-rank {start} must be a multiple of --data-parallel-size-local "
                f"{ns.dp_local} below --data-parallel-size {dp}"
            )
        if headless and start == 0:
            raise CommandLineError("the pod with --data-parallel-start-rank 0 runs the API server: drop --headless")
        if not headless and (start > 0 or ns.hybrid_lb):  # hybrid load balancing: serves its own ranks
            dp = ns.dp_local
        else:
            if headless and not ns.dp_address:
                raise CommandLineError("a --headless rank needs --data-parallel-address (the leader's host)")
            plan = GroupPlan(dp // ns.dp_local, start // ns.dp_local, ns.dp_address or "127.0.0.1", ns.dp_rpc_port)
    elif headless:
        raise CommandLineError("--headless needs a group: --data-parallel-size-local below --data-parallel-size, "
                               "or --nnodes > 1 with --node-rank")  # fmt: skip
    expert = bool(ns.ep_flag)
    return plan, Layout(ns.tp, ns.pp, dp, expert, a2a, ns.overlap)


def _sglang(ns: argparse.Namespace, role: str | None) -> tuple[GroupPlan, Layout]:
    plan = GroupPlan()
    if ns.nnodes > 1:
        if not ns.dist_init_addr:
            raise CommandLineError("--nnodes > 1 needs --dist-init-addr LEADER:PORT")
        _check_rank(ns.node_rank, ns.nnodes, "--node-rank")
        if (ns.tp * ns.pp) % ns.nnodes:
            raise CommandLineError(f"--tp-size {ns.tp} x --pp-size {ns.pp} does not split over --nnodes {ns.nnodes}")
        host, port = _host_port(ns.dist_init_addr, "--dist-init-addr")
        plan = GroupPlan(ns.nnodes, ns.node_rank, host, port)
    dp_attention = bool(ns.dp_attn) and ns.dp > 1
    if dp_attention and ns.tp % ns.dp:
        raise CommandLineError(f"--tp-size {ns.tp} is not a multiple of --dp-size {ns.dp} (data-parallel attention)")
    tp, dp = (ns.tp // ns.dp, ns.dp) if dp_attention else (ns.tp, ns.dp)
    mode = ns.deepep_mode if ns.deepep_mode != "auto" else ("low_latency" if role == "decode" else "normal")
    a2a: A2aKind = "low_latency" if mode == "low_latency" else "high_throughput"
    expert = ns.ep_size > 1 or ns.moe_a2a_backend == "deepep"
    return plan, Layout(tp, ns.pp, dp, expert, a2a, ns.overlap)


def read_group(ns: argparse.Namespace, engine: str, env: Mapping[str, str],
               role: str | None = None) -> tuple[GroupPlan, Layout]:  # fmt: skip
    """This pod's group plan and the layout to model (the whole replica on its leader)."""
    return _sglang(ns, role) if engine == "sglang" else _vllm(ns, env)


def gpu_blocks(cfg: EmulatorConfig, weight_bytes: float, kv_bytes_per_token: int, hbm_bytes: float) -> int:
    """KV blocks in the HBM left after weights, as vLLM sizes its cache (or the override)."""
    if cfg.num_gpu_blocks_override:
        return cfg.num_gpu_blocks_override
    free = cfg.tp * hbm_bytes * cfg.gpu_memory_utilization - weight_bytes
    return max(16, int(free // (kv_bytes_per_token * cfg.block_size)))


def wide(cfg: EmulatorConfig) -> bool:
    """Whether this engine is a data/expert-parallel or multi-node replica (timed by its Parallelism)."""
    layout = cfg.layout
    return cfg.group.multi_node or layout.dp > 1 or layout.pp > 1 or layout.expert_parallel


def replica_blocks(cfg: EmulatorConfig, spec: ModelSpec, hbm_bytes: float) -> int:
    """KV blocks of a whole wide replica: every GPU's HBM less the weights (the dense ones once per
    data-parallel rank); a latent (MLA) cache is held whole by each tensor-parallel rank. vLLM applies
    --num-gpu-blocks-override in each engine core, that is to each data-parallel rank."""
    layout = cfg.layout
    if cfg.num_gpu_blocks_override:
        return cfg.num_gpu_blocks_override * layout.dp
    weights = spec.weight_bytes + spec.dense_bytes * (layout.dp - 1)
    free = layout.world * hbm_bytes * cfg.gpu_memory_utilization - weights
    per_token = spec.kv_bytes_per_token * (layout.tp if spec.mla else 1)
    return max(16 * layout.dp, int(free // (per_token * cfg.block_size)))
