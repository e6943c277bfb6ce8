"""Live runs on emulated workers: the real peer routers beside xpyd, and xpyd's router replicas.

Every run starts fresh emulators (`xpyd emulate`, caches empty) that publish KV events, replays
its requests open-loop (streamed) through one router setup, and reads the prefix hit ratio from
the workers' own counters (`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.cache import scenarios as sc
from bench.cache import workloads as wl
from procs import BIN, KV, Procs, free_port, router_command, wait_http  # type: ignore[import-not-found]
from replay import pct, scrape  # type: ignore[import-not-found]

from xpyd_load.prompts import block_text
from xpyd_sim.trace import TraceRequest

MODEL_8B, MODEL_70B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"
EVENTS_PORT, REPLAY_PORT = 5557, 5657
EVENTS = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": f"tcp://*:{EVENTS_PORT}",
    "replay_endpoint": f"tcp://*:{REPLAY_PORT}",
    "topic": "kv-events",
}
_RUN = 0
MAX_OUTPUT = 32  # answers are capped: TTFT and the hit ratio do not depend on the tail of a decode
PEERS = [
    ("xpyd kv-aware + KV events", "xpyd", ["--tokenizer", "emulator", "--kv-events-port", str(EVENTS_PORT)]),
    ("xpyd kv-aware, own routes only", "xpyd", []),
    ("sglang-router cache_aware", "sglang", ["--policy", "cache_aware"]),
    ("vllm-router cache_aware", "vllm", ["--policy", "cache_aware"]),
]
LIVE_SCENARIOS = [("chat-20rps-small", 30.0), ("chat-28rps-small", 30.0)]  # (scenario, seconds replayed)
WARM_S = 60.0  # the slice replayed starts here: conversations are under way


def scrub(text: str) -> str:
    """An error for the results file: absolute paths (a peer's backtrace names its build folders) cut to the file."""
    return re.sub(r"(?:/[\w.+-]+){1,}/([\w.+-]+)", r"<path>/\1", text)


def _emulators(
    procs: Procs,
    roles: list[tuple[str, str]],
    model: str,
    gpu: str,
    blocks: int | None,
    speedup: float,
    tp: int = 1,
    args: tuple[str, ...] = (),
) -> list[Any]:
    global _RUN
    _RUN += 1
    out = []
    for i, (role, domain) in enumerate(roles):
        host = f"127.0.{100 + _RUN % 100}.{10 + i}"  # fresh addresses each run: no port still closing
        port = free_port(host)
        cmd = [
            str(BIN / "xpyd"),
            "emulate",
            "--speedup",
            str(speedup),
            "--log-level",
            "WARNING",
            "--",
            "vllm",
            "serve",
            model,
            "--host",
            host,
            "--port",
            str(port),
            "--kv-transfer-config",
            KV,
            "--tensor-parallel-size",
            str(tp),
            "--kv-events-config",
            json.dumps(EVENTS),
        ]
        if blocks:
            cmd += ["--num-gpu-blocks-override", str(blocks)]
        cmd += args
        env = {
            "XPYD_GPU": gpu,
            "XPYD_NVLINK_DOMAIN": domain,
            "XPYD_NODE_NAME": domain,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port(host)),
        }
        out.append((role, procs.spawn(f"emu-{role}-{i}", f"http://{host}:{port}", cmd, env)))
    for _, e in out:
        wait_http(e.url, proc=e)
    return out


def _bodies(reqs: list[TraceRequest], block_tokens: int, speedup: float) -> tuple[list[dict[str, Any]], list[float]]:
    t0 = reqs[0].arrival
    bodies, arrivals = [], []
    for r in reqs:
        text = "".join(block_text(b, block_tokens) for b in r.blocks)
        want = r.prompt_tokens * 4
        text = (text + block_text(hash((r.arrival, r.prompt_tokens)) & 0xFFFFFFFF, max(1, r.prompt_tokens)))[:want]
        bodies.append(
            {
                "model": "",
                "prompt": text,
                "max_tokens": max(1, min(r.output_tokens, MAX_OUTPUT)),
                "stream": True,
                "ignore_eos": True,
            }
        )
        arrivals.append((r.arrival - t0) / speedup)
    return bodies, arrivals


def _replay(url: str, bodies: list[dict[str, Any]], arrivals: list[float]) -> list[list[Any]]:
    spec = {"mode": "open", "url": url + "/v1/completions", "bodies": bodies, "arrivals": arrivals}
    loadgen = Path(__file__).resolve().parents[1] / "router" / "loadgen.py"
    out = subprocess.run(
        [str(BIN / "python"), str(loadgen)],
        input=json.dumps(spec).encode(),
        capture_output=True,
        check=True,
        timeout=600,
    )
    results: list[list[Any]] = json.loads(out.stdout)["results"]
    return results


def _hit_ratio(urls: list[str]) -> float:
    stats = [scrape(u) for u in urls]
    queries = sum(s.get("vllm:prefix_cache_queries_total", 0.0) for s in stats)
    return sum(s.get("vllm:prefix_cache_hits_total", 0.0) for s in stats) / queries if queries else 0.0


def _summary(results: list[list[Any]], slo_ttft: float = 2.0) -> dict[str, Any]:
    ok = [r for r in results if r[2]]
    ttft = [r[0] for r in ok]
    return {
        "ok": len(ok),
        "n": len(results),
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p99_s": pct(ttft, 0.99),
        "ttft_attainment": sum(1 for t in ttft if t <= slo_ttft) / len(results) if results else None,
    }


def run_peers(logdir: Path, quick: bool = False) -> list[dict[str, Any]]:
    """The single-pool chat scenarios (4 workers, caches half the working set) under each router."""
    rows = []
    for name, seconds in LIVE_SCENARIOS[:1] if quick else LIVE_SCENARIOS:
        s = next(x for x in sc.SCENARIOS if x.name == name)
        end = WARM_S + (10 if quick else seconds)
        reqs = [r for r in sc.load(s) if WARM_S <= r.arrival < end]
        bodies, arrivals = _bodies(reqs, sc.block_tokens(s), 1.0)
        ws = wl.working_set_tokens(reqs, sc.block_tokens(s))
        cache_blocks = int(ws * sc.SMALL / 4) // 16 + 2048  # the prefix cache, plus room for running requests
        for label, kind, extra in PEERS:
            procs = Procs(logdir)
            try:
                workers = _emulators(
                    procs, [("worker", f"node-{i}") for i in range(4)], MODEL_8B, "H100", cache_blocks, 1.0
                )
                urls = [e.url for _, e in workers]
                for b in bodies:
                    b["model"] = MODEL_8B
                port = free_port("127.0.0.1")
                router = procs.spawn("router", f"http://127.0.0.1:{port}", router_command(kind, port, [], urls, extra))
                wait_http(router.url, "/health", 60, router)
                row = _summary(_replay(router.url, bodies, arrivals)) | {"prefix_hit_ratio": _hit_ratio(urls)}
            except (RuntimeError, TimeoutError, subprocess.SubprocessError) as exc:
                row = {"error": scrub(str(exc)[-300:])}
            finally:
                procs.stop_all()
            rows.append({"scenario": name, "router": label, "requests": len(reqs), "cache_blocks": cache_blocks} | row)
    return rows


REPLICA_RUNS = [  # (trace scenario, deployment roles, model, speedup, seconds of the trace replayed)
    (
        "mooncake-conv-large",
        [
            ("prefill", "node-0"),
            ("prefill", "node-1"),
            ("decode", "node-0"),
            ("decode", "node-1"),
            ("decode", "node-2"),
            ("decode", "node-3"),
        ],
        MODEL_70B,
        2,
        100,
    ),
    (
        "azure-conv",
        [("prefill", "node-0"), ("prefill", "node-1"), ("decode", "node-0"), ("decode", "node-1")],
        MODEL_70B,
        2,
        60,
    ),
]


def run_replicas(logdir: Path, quick: bool = False, counts: tuple[int, ...] = (1, 2, 4, 8)) -> list[dict[str, Any]]:
    """1/2/4/8 xpyd router replicas (KV events, sharing load and routes) with `xpyd load` spreading the requests."""
    rows = []
    for name, roles, model, speedup, seconds in REPLICA_RUNS[:1] if quick else REPLICA_RUNS:
        s = next(x for x in sc.SCENARIOS if x.name == name)
        trace = Path(__file__).resolve().parents[2] / "data" / "traces"
        path = trace / (
            "conversation_trace.jsonl" if name.startswith("mooncake") else "AzureLLMInferenceTrace_conv.csv"
        )
        span = (60 if quick else seconds) / speedup
        for n in counts:
            procs = Procs(logdir)
            try:
                workers = _emulators(
                    procs, roles, model, "B200", None, float(speedup), tp=8 if "mooncake" in name else 2
                )
                flags = []
                for (role, domain), (_, e) in zip(roles, workers, strict=True):
                    flags += [f"--{role}", f"{e.url}@{domain}"]
                ports = [free_port("127.0.0.1") for _ in range(n)]
                urls = [f"http://127.0.0.1:{p}" for p in ports]
                routers = []
                for i, port in enumerate(ports):
                    peers = ["--peers", *[u for j, u in enumerate(urls) if j != i]] if n > 1 else []
                    cmd = [
                        str(BIN / "xpyd"),
                        "router",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        *flags,
                        "--tokenizer",
                        "emulator",
                        "--kv-events-port",
                        str(EVENTS_PORT),
                        *peers,
                    ]
                    routers.append(procs.spawn(f"router-{i}", urls[i], cmd))
                for r in routers:
                    wait_http(r.url, "/health", 60, r)
                cmd = [
                    str(BIN / "xpyd"),
                    "load",
                    *[a for u in urls for a in ("--url", u)],
                    "--model",
                    model,
                    "--trace",
                    str(path),
                    "--speedup",
                    str(speedup),
                    "--duration",
                    str(span),
                    "--max-requests",
                    "100000",
                    "--max-output-tokens",
                    str(MAX_OUTPUT),
                    "--max-in-flight",
                    "512",
                    "--json",
                    "--slo-ttft",
                    str(2.0 / speedup),
                    "--slo-itl",
                    str(0.1 / speedup),
                ]  # modelled time
                out = subprocess.run(cmd, capture_output=True, check=True, timeout=span + 300)
                row = json.loads(out.stdout.decode().strip().splitlines()[-1])
                row["prefix_hit_ratio"] = _hit_ratio([e.url for role, e in workers if role == "prefill"])
            except (RuntimeError, TimeoutError, subprocess.SubprocessError, ValueError) as exc:
                row = {"error": scrub(str(exc)[-300:])}
            finally:
                procs.stop_all()
            rows.append({"scenario": s.name, "replicas": n, "speedup": speedup} | row)
    return rows
