"""Scale to zero and back, end to end: a deployment whose pools stand at zero keeps its model listed,
the router holds the requests that arrive, the autoscaler reads the held count from the real
Prometheus and starts the pools, and every held request is answered once they are up (none lost).
Then, idle past the stabilization window, the autoscaler takes both pools back to zero on its own,
the model stays listed, and a second round of held requests wakes them again. Once under the threshold
policy, once under the SLO policy (spec.slo).

Needs the cluster named by KUBECONFIG with a Prometheus that discovers annotated pods (the local
harness starts one at http://127.0.0.1:9090; elsewhere set XPYD_PROMETHEUS_URL).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import aiohttp
import pytest

from .dashboards_check import panel_failures
from .kube import chart_namespace, kubectl
from .kube import find_json as get_json
from .load_clients import pod_urls, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELEASE = "xpyd-zero-e2e"
NAME = "zero"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMETHEUS = os.environ.get("XPYD_PROMETHEUS_URL", "http://127.0.0.1:9090")
HELD = 6  # requests sent while both pools are at zero
DD = """
apiVersion: xpyd.io/v1alpha1
kind: DisaggregatedDeployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  model: {{name: {model}}}
  engine: {{kind: emulator}}
  mode: Disaggregated
  topology: {{kind: HGX-B200}}
  prefill:
    replicas: 0
    gpusPerReplica: 1
    autoscaling: {{minReplicas: 0, maxReplicas: 2}}
  decode:
    replicas: 0
    gpusPerReplica: 1
    autoscaling: {{minReplicas: 0, maxReplicas: 2}}
  router: {{replicas: 1, policy: kv-aware}}
{slo}  autoscaling:
    enabled: true
    prometheusUrl: {prometheus}
    intervalSeconds: 5
    stabilizationSeconds: {stabilization}
"""
STABILIZATION_S = 20  # idle this long (plus the load's rate windows), the pools go back to zero
POLICIES = {"threshold": (NAME, ""), "slo": (f"{NAME}-slo", "  slo: {ttftSeconds: 1, itlSeconds: 0.05}\n")}


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    with chart_namespace("xpyd-zero", RELEASE, *(name for name, _ in POLICIES.values())) as ns:
        yield ns


def replicas(ns: str, name: str, role: str) -> int:
    sts = get_json("statefulset", f"{name}-{role}", "-n", ns) or {}
    return int(sts.get("spec", {}).get("replicas", -1))


async def _complete(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, float]:
    start = time.monotonic()
    body = {"model": MODEL, "prompt": f"request {i}: tell me about the sea " * 20, "max_tokens": 8}
    async with session.post(url + "/v1/completions", json=body) as resp:
        await resp.read()
        return resp.status, time.monotonic() - start


@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", list(POLICIES))
async def test_requests_held_at_zero_are_answered_once_the_pools_wake(namespace: str, policy: str) -> None:
    ns, (name, slo) = namespace, POLICIES[policy]
    manifest = DD.format(name=name, ns=ns, model=MODEL, prometheus=PROMETHEUS, stabilization=STABILIZATION_S, slo=slo)
    kubectl("apply", "-f", "-", stdin=manifest)

    def at_zero() -> bool:
        return replicas(ns, name, "prefill") == replicas(ns, name, "decode") == 0

    await wait_until("both pools' StatefulSets at zero", at_zero, 120)
    # The router is ready with no worker (it takes the requests that wake the pools) and lists the model.
    router = (await wait_until("a ready router", lambda: pod_urls(ns, name, "router"), 180))[0]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def listed() -> list[str]:
            try:
                async with session.get(router + "/v1/models") as resp:
                    return [m["id"] for m in (await resp.json())["data"]] if resp.status == 200 else []
            except aiohttp.ClientConnectionError:
                return []  # a Running pod whose router is not listening yet

        for _ in range(60):  # Running leads listening, and readiness leads the Service's view by a probe period
            if await listed() == [MODEL]:
                break
            await asyncio.sleep(1)
        assert await listed() == [MODEL]
        cold_starts: list[float] = []
        idle_to_zero = 0.0
        for round_ in range(2):  # from zero, back to zero by itself, and from zero again
            t0 = time.monotonic()
            answers = await asyncio.gather(*(_complete(session, router, round_ * HELD + i) for i in range(HELD)))
            cold_starts.append(time.monotonic() - t0)
            assert [status for status, _ in answers] == [200] * HELD, answers  # none lost, none refused
            assert await listed() == [MODEL]  # and now from a worker
            assert replicas(ns, name, "prefill") >= 1 and replicas(ns, name, "decode") >= 1
            if round_ == 0:
                t_idle = time.monotonic()
                await wait_until("both pools back at zero once idle", at_zero, STABILIZATION_S + 240)
                idle_to_zero = time.monotonic() - t_idle
                assert await listed() == [MODEL]  # at zero again, the model is still listed
    # The dashboards' scale-to-zero panels (held requests, their outcomes, pools woken) have data for it.
    failures = await asyncio.to_thread(panel_failures, PROMETHEUS, [(ns, name)], 900.0, (), "scale-to-zero")
    assert not failures, "\n".join(failures)
    dd = get_json("dd", name, "-n", ns) or {}
    auto = (dd.get("status") or {}).get("autoscaler") or {}
    reasons = {role: (auto.get(role) or {}).get("reason") for role in ("prefill", "decode")}
    if slo:  # the SLO policy sized the pools between the wakes (what it learnt is in status), not the thresholds
        assert all("sloCorrection" in (auto.get(role) or {}) for role in ("prefill", "decode")), auto
    kubectl("delete", "dd", name, "-n", ns, "--wait=false", check=False)  # its pods make room for the next
    starts = " and ".join(f"{s:.1f} s" for s in cold_starts)
    print(
        f"{policy}: cold starts from zero: {starts} for {HELD} held requests each; idle to zero in"
        f" {idle_to_zero:.0f} s (stabilization {STABILIZATION_S} s); autoscaler: {reasons}"
    )
