"""Faithfulness: the simulator against the emulator's measured timings and against `xpyd plan`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from xpyd_perf import break_even, resolve_model, resolve_topology
from xpyd_sim import spec as specs
from xpyd_sim.engine import SimConfig, Simulation
from xpyd_sim.metrics import Histogram
from xpyd_sim.perfmodel import Links, PoolPerf
from xpyd_sim.request import SimRequest
from xpyd_sim.trace import TraceRequest, fresh_blocks
from xpyd_sim.worker import Worker

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Saturated runs use a bigger model: ~12 ms decode steps, so the emulator's per-step Python work on a
# busy machine stays small against the modelled step time.
BIG = "Qwen/Qwen3-32B"
# The emulators run in slow motion: each modelled second takes 1 / SLOW (4) wall seconds, so the
# emulator's own Python work (parsing, tokenizing, scheduling) on a busy 2-core machine hides inside
# the modelled steps instead of adding to them; measured wall time x SLOW is modelled time.
SLOW = 0.25
COLOCATED = """\
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {{name: one-worker}}
spec:
  model: {{name: {model}}}
  mode: Colocated
  topology: {{kind: HGX-B200}}
  worker: {{replicas: 1, gpusPerReplica: 1}}
"""


@pytest.fixture(scope="module")
def emulator(emulate: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    with emulate(BIG, speedup=SLOW) as url:
        yield url


def _simulate(tmp_path: Path, load: list[TraceRequest], model: str = MODEL) -> Simulation:
    path = tmp_path / "one.yaml"
    path.write_text(COLOCATED.format(model=model))
    sim = Simulation(specs.load(path), load, SimConfig())
    sim.run()
    return sim


def _text(prompt: int, seed: int) -> str:
    """A prompt of exactly `prompt` emulator tokens (4 characters each) sharing no prefix with another seed."""
    return (f"r{seed:06d} " * (prompt // 2 + 1))[: 4 * prompt]


async def _complete(
    client: httpx.AsyncClient, url: str, prompt: int, max_tokens: int, seed: int, model: str = MODEL
) -> float:
    body = {"model": model, "prompt": _text(prompt, seed), "max_tokens": max_tokens, "ignore_eos": True}
    start = time.perf_counter()
    resp = await client.post(url + "/v1/completions", json=body, timeout=60)
    resp.raise_for_status()
    assert resp.json()["usage"]["completion_tokens"] == max_tokens
    return time.perf_counter() - start


def test_single_request_ttft_matches_emulator(emulator: str, tmp_path: Path) -> None:
    prompt = 20_000

    async def measure() -> float:
        async with httpx.AsyncClient() as client:
            await _complete(client, emulator, 16, 1, seed=99, model=BIG)  # warm the connection
            return await _complete(client, emulator, prompt, 1, seed=1, model=BIG)

    measured = asyncio.run(measure()) * SLOW
    sim = _simulate(tmp_path, [TraceRequest(0.0, prompt, 1, fresh_blocks(prompt, 0, 16))], BIG)
    simulated = float(sim.metrics.ttft[0])
    print(f"faithfulness: simulated {simulated:.4f} vs emulator {measured:.4f} ({simulated / measured - 1:+.1%})")
    assert simulated == pytest.approx(measured, rel=0.10), (simulated, measured)


def test_saturated_throughput_matches_emulator(emulator: str, tmp_path: Path) -> None:
    """A batch that keeps one worker busy from first prefill to last token: output tokens per second."""
    n, prompt, out = 32, 1000, 100

    async def measure() -> float:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n)) as client:
            await _complete(client, emulator, 16, 1, seed=99, model=BIG)
            start = time.perf_counter()
            await asyncio.gather(*(_complete(client, emulator, prompt, out, 100 + i, BIG) for i in range(n)))
            return time.perf_counter() - start

    measured = n * out / (asyncio.run(measure()) * SLOW)
    load = [TraceRequest(0.0, prompt, out, fresh_blocks(prompt, i, 16)) for i in range(n)]
    sim = _simulate(tmp_path, load, BIG)
    simulated = n * out / sim.end_time
    print(f"faithfulness: simulated {simulated:.4f} vs emulator {measured:.4f} ({simulated / measured - 1:+.1%})")
    assert simulated == pytest.approx(measured, rel=0.10), (simulated, measured)


DISAGGREGATED = """\
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {name: one-pair}
spec:
  model: {name: meta-llama/Llama-3.1-70B-Instruct}
  topology: {kind: HGX-B200}
  prefill: {replicas: 1, gpusPerReplica: 8}
  decode: {replicas: 1, gpusPerReplica: 8}
"""


def test_two_hop_ttft_matches_emulated_prefill_decode_pair(
    tmp_path: Path, emulate: Callable[..., AbstractContextManager[str]]
) -> None:
    """Prefill on one HGX node, KV over 8 NICs to a decode worker on another, first token there."""
    model, prompt = "meta-llama/Llama-3.1-70B-Instruct", 30_000
    kv = ["--tensor-parallel-size", "8", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    node_a, node_b = (
        emulate(model, *kv, domain="node-a", speedup=SLOW),
        emulate(model, *kv, domain="node-b", speedup=SLOW),
    )
    with node_a as p_url, node_b as d_url:

        async def two_hops() -> float:
            async with httpx.AsyncClient(timeout=60) as client:
                ids = _text(prompt, 5)
                remote = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                          "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
                await client.get(p_url + "/v1/models")
                await client.get(d_url + "/v1/models")
                start = time.perf_counter()
                first = await client.post(
                    p_url + "/v1/completions",
                    json={"model": model, "prompt": ids, "max_tokens": 1, "kv_transfer_params": remote},
                )
                first.raise_for_status()
                params = first.json()["kv_transfer_params"]
                second = await client.post(
                    d_url + "/v1/completions",
                    json={"model": model, "prompt": ids, "max_tokens": 1, "kv_transfer_params": params},
                )
                second.raise_for_status()
                return time.perf_counter() - start

        measured = asyncio.run(two_hops()) * SLOW
    path = tmp_path / "pair.yaml"
    path.write_text(DISAGGREGATED)
    sim = Simulation(specs.load(path), [TraceRequest(0.0, prompt, 1, fresh_blocks(prompt, 0))], SimConfig())
    sim.run()
    assert sim.metrics.handoffs["rdma"] == 1
    simulated = float(sim.metrics.ttft[0])
    print(f"faithfulness: simulated {simulated:.4f} vs emulator {measured:.4f} ({simulated / measured - 1:+.1%})")
    assert simulated == pytest.approx(measured, rel=0.10), (simulated, measured)


def _measured_stall(perf: PoolPerf, prompt: int, batch: int = 32, context: int = 2048) -> float:
    """Extra time `batch` co-located decodes take to finish when a prompt is prefilled beside them."""

    def finish(with_prompt: bool) -> float:
        w = Worker(0, "worker", "node-0", perf, gpus=8, block_tokens=512)
        for i in range(batch):
            w.pending.append(SimRequest(i, 0.0, context, 64, ()))
        w.plan(0.0)
        end = w.interrupt(0.0)  # one step: the batch is decoding when the prompt arrives
        w.complete(end, Histogram(), [], [])
        if with_prompt:
            req = SimRequest(batch, end, prompt, 1, ())
            req.direct = True
            w.waiting.append(req)
        now = end
        done: list[SimRequest] = []
        while (nxt := w.plan(now)) >= 0:
            w.complete(nxt, Histogram(), [], done)
            now = nxt
        return max(r.finished for r in done if r.rid < batch)

    return finish(True) - finish(False)


def _fits(model: str, topology: str, gpus: int = 8) -> bool:
    return resolve_model(model).weight_bytes < gpus * resolve_topology(topology).gpu.hbm_bytes * 0.9


CASES = [
    (m, t, p)
    for m in ("llama-3.1-70b", "llama-3.1-8b", "qwen3-32b", "deepseek-v3", "gpt-oss-120b")
    for t in ("HGX-B200", "GB200-NVL72", "H100")
    for p in (128, 512, 2048, 8192, 32768, 131072)
    if _fits(m, t)  # DeepSeek-V3 does not fit 8 x H100: no verdict either way
]


def test_break_even_cases_cover_both_verdicts() -> None:
    verdicts = {break_even(m, t, p, 8).disaggregate for m, t, p in CASES}
    assert verdicts == {True, False}


@pytest.mark.parametrize(("model", "topology", "prompt"), CASES)
def test_break_even_verdicts_match_xpyd_plan(model: str, topology: str, prompt: int) -> None:
    spec, topo = resolve_model(model), resolve_topology(topology)
    gpus = 8
    perf = PoolPerf(spec, topo.gpu, gpus, gpus)
    src, dst = ("node-0", "node-1") if topo.nvlink_domain == "node" else ("clique-0", "clique-0")
    transfer, _, _ = Links(topo).handoff(prompt, perf, perf, src, dst)
    stall = _measured_stall(perf, prompt)
    plan = break_even(model, topology, prompt, gpus)
    assert (transfer < stall) == plan.disaggregate, (transfer, stall, plan.summary())
    assert transfer == pytest.approx(plan.transfer_seconds, rel=1e-9)
