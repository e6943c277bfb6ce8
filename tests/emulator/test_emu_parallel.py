"""Multi-node and data/expert-parallel engine flags, per engine: this pod's rank, its leader, what is modelled."""

from __future__ import annotations

import shlex

import pytest

from xpyd_api.layout import replica_layout
from xpyd_emulator.cmdline import CommandLineError, parse_engine_command
from xpyd_emulator.engine import Sequence
from xpyd_emulator.parallel import domain_gpus
from xpyd_emulator.shellwords import expand, split_shell
from xpyd_emulator.worker import Worker
from xpyd_operator import engine_ranks
from xpyd_operator.engines import sglang as sglang_engine
from xpyd_operator.engines import vllm as vllm_engine
from xpyd_perf import attention_flops
from xpyd_perf.timing import group_step_seconds

DS = "deepseek-ai/DeepSeek-R1"
VLLM = f"vllm serve {DS} --port 8000"
SGL = f"python3 -m sglang.launch_server --model-path {DS} --port 8000"
DP16 = "--tensor-parallel-size 1 --data-parallel-size 16 --data-parallel-size-local 8 --enable-expert-parallel"
ADDR = "--data-parallel-address dd-0.dd.ns --data-parallel-rpc-port 29550"

# command line -> (nodes, rank, api, leader host, leader port, tp, pp, dp, world, expert parallel, a2a, overlap)
CASES = [
    (f"{VLLM} {DP16} {ADDR} --all2all-backend deepep_high_throughput --enable-dbo",
     (2, 0, True, "dd-0.dd.ns", 29550, 1, 1, 16, 16, True, "high_throughput", True)),
    (f"{VLLM} {DP16} {ADDR} --headless --data-parallel-start-rank 8 --all2all-backend deepep_low_latency",
     (2, 1, False, "dd-0.dd.ns", 29550, 1, 1, 16, 16, True, "low_latency", False)),
    (f"{VLLM} -tp 2 -dp 8 -dpl 2 -dpa 10.0.0.1 -dpp 5555 -dpr 6 --headless",
     (4, 3, False, "10.0.0.1", 5555, 2, 1, 8, 16, False, "low_latency", False)),
    (f"{VLLM} {DP16} --data-parallel-address dd-0.dd.ns",  # the rpc port defaults to vLLM's 29550
     (2, 0, True, "dd-0.dd.ns", 29550, 1, 1, 16, 16, True, "low_latency", False)),
    (f"{VLLM} {DP16} {ADDR} --data-parallel-start-rank 8",  # not headless: hybrid LB, serves its own 8 ranks
     (1, 0, True, "", 0, 1, 1, 8, 8, True, "low_latency", False)),
    (f"{VLLM} {DP16} {ADDR} --data-parallel-hybrid-lb",
     (1, 0, True, "", 0, 1, 1, 8, 8, True, "low_latency", False)),
    (f"{VLLM} --data-parallel-size 16 --data-parallel-rank 3 --enable-expert-parallel",  # external LB: one rank
     (1, 0, True, "", 0, 1, 1, 1, 1, True, "low_latency", False)),
    (f"{VLLM} -tp 8 -dp 2",  # single node, both ranks here
     (1, 0, True, "", 0, 8, 1, 2, 16, False, "low_latency", False)),
    (f"{VLLM} --tensor-parallel-size 16 --nnodes 2 --node-rank 0 --master-addr dd-0.dd.ns --master-port 29550",
     (2, 0, True, "dd-0.dd.ns", 29550, 16, 1, 1, 16, False, "low_latency", False)),
    (f"{VLLM} -tp 8 -pp 2 -n 2 -r 1 --master-addr dd-0.dd.ns --headless",  # master port defaults to 29501
     (2, 1, False, "dd-0.dd.ns", 29501, 8, 2, 1, 16, False, "low_latency", False)),
    (f"{SGL} --tp-size 16 --nnodes 2 --node-rank 0 --dist-init-addr dd-0.dd.ns:20000",
     (2, 0, True, "dd-0.dd.ns", 20000, 16, 1, 1, 16, False, "high_throughput", False)),
    (f"{SGL} --tp 32 --dp-size 32 --enable-dp-attention --nnodes 4 --node-rank 3 --dist-init-addr 10.1.2.3:20000 "
     "--moe-a2a-backend deepep --deepep-mode low_latency --disaggregation-mode decode",
     (4, 3, False, "10.1.2.3", 20000, 1, 1, 32, 32, True, "low_latency", False)),
    (f"{SGL} --tp 16 --dp 4 --enable-dp-attention --ep-size 16 --nnodes 2 --node-rank 1 "
     "--dist-init-addr [fd00::1]:20000 --enable-two-batch-overlap --disaggregation-mode prefill",
     (2, 1, False, "fd00::1", 20000, 4, 1, 4, 16, True, "high_throughput", True)),
    (f"{SGL} --tp 8 --moe-a2a-backend deepep --disaggregation-mode decode",  # deepep mode auto: by role
     (1, 0, True, "", 0, 8, 1, 1, 8, True, "low_latency", False)),
    (f"{SGL} --tp 8 --dp-size 2",  # no dp attention: two replicas of tp 8
     (1, 0, True, "", 0, 8, 1, 2, 16, False, "high_throughput", False)),
]  # fmt: skip


@pytest.mark.parametrize(("command", "expected"), CASES)
def test_group_and_layout_per_engine(command: str, expected: tuple[object, ...]) -> None:
    cfg = parse_engine_command(shlex.split(command), {})
    g, lay = cfg.group, cfg.layout
    got = (g.nodes, g.rank, g.api, g.leader_host, g.leader_port, lay.tp, lay.pp, lay.dp, lay.world)
    assert (*got, lay.expert_parallel, lay.a2a, lay.overlap) == expected
    assert cfg.extra_args == []


def test_vllm_0_11_0_takes_the_all_to_all_kernel_from_env() -> None:
    env = {"VLLM_ALL2ALL_BACKEND": "deepep_high_throughput"}
    assert parse_engine_command(shlex.split(f"{VLLM} {DP16} {ADDR}"), env).layout.a2a == "high_throughput"
    with pytest.raises(CommandLineError, match="env VLLM_ALL2ALL_BACKEND 'deepep'"):
        parse_engine_command(shlex.split(f"{VLLM} {DP16}"), {"VLLM_ALL2ALL_BACKEND": "deepep"})


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (f"{VLLM} -dp 16 -dpl 6 {ADDR}", "not a multiple of --data-parallel-size-local 6"),
        (f"{VLLM} {DP16} {ADDR} --headless --data-parallel-start-rank 4", "must be a multiple"),
        (f"{VLLM} {DP16} {ADDR} --headless --data-parallel-start-rank 16", "below --data-parallel-size 16"),
        (f"{VLLM} {DP16} {ADDR} --headless", "runs the API server: drop --headless"),
        (f"{VLLM} {DP16} --headless --data-parallel-start-rank 8", "needs --data-parallel-address"),
        (f"{VLLM} --headless", "--headless needs a group"),
        (f"{VLLM} -tp 16 --nnodes 2 --node-rank 2 --master-addr a --headless", "--node-rank 2 is out of range"),
        (f"{VLLM} -tp 16 --nnodes 2 --node-rank 1 --master-addr a", "with --headless"),
        (f"{VLLM} -tp 16 --nnodes 2 --node-rank 0 --master-addr a --headless", "with --headless"),
        (f"{VLLM} -tp 6 --nnodes 4 --node-rank 0", "does not split over --nnodes 4"),
        (f"{VLLM} -dp 4 --nnodes 2 --node-rank 0", "for tensor/pipeline parallel only"),
        (f"{VLLM} {DP16} --data-parallel-rpc-port 0", "argument --data-parallel-rpc-port/-dpp: 0 is out of range"),
        (f"{VLLM} --node-rank -1", "argument --node-rank/-r: -1 is out of range"),
        (f"{VLLM} --all2all-backend deepep", "argument --all2all-backend: invalid choice"),
        (f"{SGL} --tp 16 --nnodes 2 --node-rank 1", "needs --dist-init-addr"),
        (f"{SGL} --tp 16 --nnodes 2 --node-rank 1 --dist-init-addr leader", "is not HOST:PORT"),
        (f"{SGL} --tp 16 --nnodes 2 --node-rank 1 --dist-init-addr leader:99999", "is not HOST:PORT"),
        (f"{SGL} --tp 16 --nnodes 2 --node-rank 5 --dist-init-addr a:1", "--node-rank 5 is out of range"),
        (f"{SGL} --tp 12 --dp-size 8 --enable-dp-attention", "not a multiple of --dp-size 8"),
        (f"{SGL} --deepep-mode fast", "argument --deepep-mode: invalid choice"),
        (f"{SGL} --moe-a2a-backend mooncake", "argument --moe-a2a-backend: invalid choice"),
        (f"{VLLM} --data-parallel-start-ranks 8", "did you mean --data-parallel-start-rank?"),
        (f"{VLLM} --data-parallel-adress x", "did you mean --data-parallel-address?"),
    ],
)
def test_bad_group_flags_are_one_line_errors(command: str, message: str) -> None:
    with pytest.raises(CommandLineError, match=message.replace("?", r"\?")):
        parse_engine_command(shlex.split(command), {})


def test_flags_of_the_other_engine_pass_through() -> None:
    # SGLang's group flags mean nothing to vLLM (and vice versa): accepted and ignored, as the engines would not be
    vllm = parse_engine_command(shlex.split(f"{VLLM} --dist-init-addr a:1 --ep-size 4 --deepep-mode normal"), {})
    assert (vllm.group.nodes, vllm.layout.expert_parallel) == (1, False)
    sgl = parse_engine_command(shlex.split(f"{SGL} --headless --data-parallel-start-rank 8 --enable-dbo"), {})
    assert (sgl.group.nodes, sgl.layout.overlap) == (1, False)
    assert sgl.extra_args == ["--headless", "--data-parallel-start-rank", "8", "--enable-dbo"]


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a $(( ${LWS_WORKER_INDEX:-0} * 8 )) b", {"LWS_WORKER_INDEX": "3"}, "a 24 b"),
        ("$(( ${LWS_WORKER_INDEX:-0} * 8 ))", {}, "0"),
        ("$((7 / 2)) $((-7 / 2)) $((7 % -3)) $(( (1 + 2) * -3 ))", {}, "3 -3 1 -9"),
        ("--addr ${LWS_LEADER_ADDRESS}:20000 $HOME_X", {"LWS_LEADER_ADDRESS": "l-0.l.ns"}, "--addr l-0.l.ns:20000 "),
        ('\'{"k": "$NOPE"}\' "$X" \\$X', {"X": "x", "NOPE": "no"}, '\'{"k": "$NOPE"}\' "x" \\$X'),
        ("cost $5 ${EMPTY:-dflt} ${EMPTY}", {"EMPTY": ""}, "cost $5 dflt "),
    ],
)
def test_shell_expansion(text: str, env: dict[str, str], expected: str) -> None:
    assert expand(text, env) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("$(( 2 ** 3 ))", "integers and"),
        ("$(( 1 / 0 ))", "division by zero"),
        ("$(( 1 + ", "unterminated"),
        ("$(cat /etc/passwd)", "unsupported shell expansion"),
        ("${#X}", "unsupported shell expansion"),
        ("$(( __import__('os') ))", "integers and"),
        ("$(( " + "1+" * 200 + "1 ))", "too long"),
    ],
)
def test_shell_expansion_refuses_what_it_cannot_do(text: str, message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        expand(text, {})


@pytest.mark.parametrize(("engine", "role"), [("vllm", "prefill"), ("vllm", "decode"), ("sglang", "decode")])
def test_every_rank_the_operator_renders_parses_to_its_place(engine: str, role: str) -> None:
    """The operator's command lines for a 4-pod DP32/EP replica, run through sh -c with LeaderWorkerSet's env."""
    layout = replica_layout(32, 1, 1, 32, True, 8)
    base = [VLLM, "--tensor-parallel-size 1 --data-parallel-size 32 --enable-expert-parallel"]
    if engine == "sglang":
        base = [SGL, "--tp 32 --dp-size 32 --enable-dp-attention --ep-size 32", f"--disaggregation-mode {role}"]
    for index in range(layout.pods):
        rank: engine_ranks.Rank = "leader" if index == 0 else "worker"
        words = (vllm_engine.rank_flags(layout, rank) if engine == "vllm"
                 else sglang_engine.rank_flags(layout, role))  # fmt: skip
        argv = engine_ranks.shell([*shlex.split(" ".join(base)), *words])
        env = {"LWS_LEADER_ADDRESS": "ds-prefill-0.ds-prefill.ns", "LWS_GROUP_SIZE": "4"}
        env["LWS_WORKER_INDEX"] = str(index)
        if engine == "vllm":  # vLLM v0.11.0 takes its all-to-all kernel from the env the operator sets
            env[vllm_engine.ALL2ALL_ENV] = vllm_engine.ALL2ALL[role]
        cfg = parse_engine_command(["xpyd-entrypoint-ignored", *argv][1:], env)
        port = 29550 if engine == "vllm" else 20000
        assert (cfg.group.nodes, cfg.group.rank, cfg.group.api) == (4, index, index == 0)
        assert (cfg.group.leader_host, cfg.group.leader_port) == ("ds-prefill-0.ds-prefill.ns", port)
        assert (cfg.layout.world, cfg.layout.dp, cfg.layout.expert_parallel) == (32, 32, True)
        assert cfg.layout.a2a == ("high_throughput" if role == "prefill" else "low_latency")
        assert split_shell(argv, env)[0] in ("vllm", "python3")


def test_nvlink_domain_sizes_come_from_the_topology_table() -> None:
    assert (domain_gpus("GB200"), domain_gpus("b200"), domain_gpus("H800"), domain_gpus("unknown")) == (72, 8, 8, 8)


async def test_a_wide_leader_models_the_whole_replica_and_plain_tp_keeps_the_engine_model() -> None:
    plain = Worker(parse_engine_command(shlex.split(f"{VLLM} -tp 8"), {}))
    assert plain.engine.parallel is None and plain.group is None and plain.engine.budget == 8192
    lead = Worker(parse_engine_command(shlex.split(f"{VLLM} {DP16} {ADDR}"), {"XPYD_GPU": "GB200"}))
    par = lead.engine.parallel
    assert par is not None and lead.group is not None and (par.world, par.domain_gpus) == (16, 72)
    assert (lead.engine.budget, lead.engine.max_seqs) == (8192 * 16, 256 * 16)  # vLLM's limits are per rank
    assert lead.pool.num_blocks > 16 * plain.pool.num_blocks // 8  # 16 GPUs' HBM, dense weights per rank
    lead._group_complete(["rack-a.1", "rack-a.1"])  # both pods report one NVLink domain (an NVL72 clique)
    assert lead.engine.parallel is not None and not lead.engine.parallel.spans_domains
    lead._group_complete(["node-0", "node-1"])
    assert lead.engine.parallel is not None and lead.engine.parallel.nvlink_gpus == 8
    lead._group_complete(["node-0", None])  # a pod without XPYD_NVLINK_DOMAIN: the GPU's usual domain
    assert lead.engine.parallel is not None and lead.engine.parallel.domain_gpus == 72
    sgl = Worker(parse_engine_command(shlex.split(f"{SGL} --tp 8 --dp-size 8 --enable-dp-attention"), {}))
    assert sgl.engine.parallel is not None and sgl.engine.budget == 8192 and sgl.group is None


async def test_a_wide_engine_chunks_a_prompt_per_rank_and_paces_by_the_busiest_rank() -> None:
    cmd = f"{VLLM} -dp 16 --enable-expert-parallel --max-num-batched-tokens 2048"
    worker = Worker(parse_engine_command(shlex.split(cmd), {"XPYD_GPU": "B200"}))
    engine, par = worker.engine, worker.engine.parallel
    assert par is not None and (engine.budget, engine.rank_budget) == (2048 * 16, 2048)
    engine.submit(Sequence(8192, [], 4, 0.0))
    decodes, chunks, seconds = engine.schedule(0.0)
    assert decodes == [] and [n for _, n in chunks] == [2048]  # one rank's budget, not the replica's
    attn = attention_flops(worker.spec, 0, 2048)
    lone = group_step_seconds(worker.spec, worker.gpu, par, tokens=2048, attn_flops=attn, kv_tokens_read=2048,
                              busiest=2048)  # fmt: skip
    assert seconds == pytest.approx(lone, rel=1e-9)
