"""The autoscaler end to end: real Prometheus scrapes emulated workers, load moves each pool, both shrink.

Needs the cluster named by KUBECONFIG with a Prometheus that discovers annotated pods through
kubernetes_sd_configs (the local harness starts one at http://127.0.0.1:9090; elsewhere set
XPYD_PROMETHEUS_URL to a Prometheus the operator can reach).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from xpyd_load.runner import LoadConfig
from xpyd_load.runner import run as run_load
from xpyd_sim import trace

from .dashboards_check import panel_failures
from .kube import chart_namespace, kubectl
from .kube import find_json as get_json
from .load_clients import Load, drive_until, pod_urls, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELEASE = "xpyd-autoscaler-e2e"
NAME = "scaler"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMETHEUS = os.environ.get("XPYD_PROMETHEUS_URL", "http://127.0.0.1:9090")
DD = """
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  engine: {{kind: emulator}}
  mode: Disaggregated
  topology: {{kind: HGX-B200}}
  prefill:
    gpusPerReplica: 1
    autoscaling: {{minReplicas: 1, maxReplicas: 3}}
  decode:
    gpusPerReplica: 1
    args: [--max-num-seqs, "4"]
    autoscaling: {{minReplicas: 1, maxReplicas: 3}}
  router: {{replicas: 1, policy: kv-aware}}
  autoscaling:
    enabled: true
    prometheusUrl: {prometheus}
    intervalSeconds: 5
"""
WINDOW_S = 30  # stabilizationSeconds, when the CRD has the field (else the policy's 300 s default)


def window_field_known() -> bool:
    crd = get_json("crd", "disaggregateddeployments.xpyd.io") or {}
    return "stabilizationSeconds" in json.dumps(crd.get("spec", {}))


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    with chart_namespace("xpyd-as", RELEASE, NAME) as ns:
        yield ns


def replicas(ns: str, role: str) -> int:
    sts = get_json("statefulset", f"{NAME}-{role}", "-n", ns) or {}
    return int(sts.get("spec", {}).get("replicas", 0))


def healthy(ns: str) -> dict[str, Any] | None:
    dd = get_json("dd", NAME, "-n", ns) or {}
    conds = {c["type"]: c for c in (dd.get("status") or {}).get("conditions") or []}
    ok = conds.get("AutoscalerHealthy", {}).get("status") == "True"
    return dd if ok else None


@pytest.mark.timeout(1200)  # about 4 min with a 30 s window, about 9 min with the 300 s default
async def test_pools_follow_prompt_and_answer_lengths(namespace: str) -> None:
    ns = namespace
    manifest = DD.format(name=NAME, ns=ns, prometheus=PROMETHEUS)
    window = WINDOW_S if window_field_known() else 300
    if window == WINDOW_S:
        manifest += f"    stabilizationSeconds: {WINDOW_S}\n"
    kubectl("apply", "-f", "-", stdin=manifest)
    try:
        await wait_until("Prometheus to see both pools (AutoscalerHealthy=True)", lambda: healthy(ns), 240)
    except AssertionError as exc:
        status = (get_json("dd", NAME, "-n", ns) or {}).get("status") or {}
        raise AssertionError(f"{exc}; conditions: {status.get('conditions')}") from None
    assert (replicas(ns, "prefill"), replicas(ns, "decode")) == (1, 1)

    # Long prompts, one-token answers: prefill queues up and grows.
    long_prompts = Load(ns, NAME, "prefill", MODEL, prompt_tokens=6000, max_tokens=1, concurrency=24)
    await drive_until(long_prompts, "prefill to grow", lambda: replicas(ns, "prefill") >= 2, 180)
    assert long_prompts.ok > 0

    # Short prompts, long answers: decode's batch (4 seqs) fills, its queue grows, decode grows.
    long_answers = Load(ns, NAME, "decode", MODEL, prompt_tokens=64, max_tokens=1500, concurrency=16)
    await drive_until(long_answers, "decode to grow", lambda: replicas(ns, "decode") >= 2, 180)
    assert long_answers.ok > 0

    # Chat-like traffic through the router (shared system prompts), so every dashboard panel has data.
    router = await wait_until("the router pod", lambda: pod_urls(ns, NAME, "router"), 60)
    synthetic = trace.Synthetic(rate=6, duration=20, prompt_mean=1500, output_mean=32, shared_prefixes=4, seed=1)
    config = LoadConfig(url=router[0], model="meta-llama/Llama-3.1-8B-Instruct", max_requests=150, duration_s=20)
    through_router = await run_load(config, trace.synthetic(synthetic))
    assert through_router.summary()["ok"] > 0, through_router.summary()

    # No load: both pools go back to their floor after the stabilization window.
    await wait_until(
        "both pools to shrink back to 1",
        lambda: replicas(ns, "prefill") == 1 and replicas(ns, "decode") == 1,
        window + 330,  # the window, then 3 -> 2 -> 1 one step per cooldown, plus pods' exits
    )
    dd = get_json("dd", NAME, "-n", ns) or {}
    auto = dd["status"]["autoscaler"]
    assert auto["prefill"]["lastScaleTime"]
    assert auto["decode"]["lastScaleTime"]
    assert auto["decode"]["desired"] == 1

    # Every dashboard panel shows this deployment's run, queried from the real Prometheus.
    failures = await asyncio.to_thread(panel_failures, PROMETHEUS, [(ns, NAME)], 900.0)
    assert not failures, "dashboard panels without data:\n" + "\n".join(failures)
