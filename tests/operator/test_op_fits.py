"""A replica that cannot hold its weights and one longest sequence is refused, with the numbers in status."""

from __future__ import annotations

from typing import Any

import pytest
from fakekube import FakeKube, b200_nodes, nvl72_nodes, spec  # type: ignore[import-not-found]

from xpyd_api import conditions as C
from xpyd_api.models import DisaggregatedDeploymentStatus
from xpyd_operator import sizing
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_perf import GPUS, MODELS, replica_fit

IMG = "ghcr.io/xpyd/xpyd:test"
TRAY = {"replicas": 1, "gpusPerReplica": 4}


@pytest.mark.parametrize(
    ("argv", "length", "utilization", "quantization", "fp8_kv"),
    [
        ([], None, 0.9, None, False),
        (["--max-model-len", "32000", "--gpu-memory-utilization=0.95"], 32000, 0.95, None, False),
        (["--context-length", "8192", "--mem-fraction-static", "0.8"], 8192, 0.8, None, False),  # SGLang's names
        (["--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"], None, 0.9, "fp8", True),
        (["--max-model-len", "1k", "--gpu-memory-utilization", "7"], None, 0.9, None, False),  # the engine's to refuse
        (["--max-model-len", "4096", "--max-model-len=8192"], 8192, 0.9, None, False),  # the last one wins
    ],
)
def test_engine_flags(argv: list[str], length: int | None, utilization: float, quantization: str | None,
                      fp8_kv: bool) -> None:  # fmt: skip
    s = spec(engine={"args": argv})
    assert s.decode is not None
    flags = sizing.engine_flags(s, s.decode)
    assert (flags.max_model_len, flags.memory_utilization, flags.quantization, flags.fp8_kv_cache) == (
        length, utilization, quantization, fp8_kv
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "modelled", "fits"),
    [
        ({"model": {"name": "deepseek-ai/DeepSeek-V3"}, "topology": {"kind": "GB200-NVL72"}, "prefill": TRAY,
          "decode": TRAY}, True, False),
        ({"model": {"name": "nvidia/DeepSeek-R1-FP4"}, "topology": {"kind": "GB200-NVL72"}, "prefill": TRAY,
          "decode": TRAY}, True, True),
        ({"decode": {"replicas": 1, "gpusPerReplica": 1}}, True, False),
        ({"decode": {"replicas": 1, "gpusPerReplica": 1}, "engine": {"args": ["--max-model-len", "16384"]}}, True,
         True),
        ({"decode": {"replicas": 1, "gpusPerReplica": 1}, "engine": {"args": ["--quantization", "fp8"]}}, True, True),
        ({"decode": {"replicas": 1, "gpusPerReplica": 1}, "topology": {"kind": "Any"}}, False, True),
        ({"decode": {"replicas": 1, "gpusPerReplica": 1}, "model": {"name": "acme/x", "kvBytesPerToken": 9}}, False,
         True),
        ({"decode": {"replicas": 1, "gpusPerReplica": 0}, "engine": {"kind": "emulator"}}, False, True),
    ],
)  # fmt: skip
def test_which_replicas_fit(overrides: dict[str, Any], modelled: bool, fits: bool) -> None:
    s = spec(**overrides)
    assert s.decode is not None
    fit = sizing.replica_fit_of(s, s.decode)
    assert (fit is not None) is modelled
    assert fit is None or fit.fits is fits


async def test_a_replica_that_does_not_fit_is_refused_with_its_numbers() -> None:
    body = {"model": {"name": "deepseek-ai/DeepSeek-V3"}, "topology": {"kind": "GB200-NVL72"}, "prefill": TRAY,
            "decode": TRAY}  # fmt: skip
    kube = FakeKube(body, nvl72_nodes())
    await Reconciler(kube, Config(own_image=IMG)).reconcile("ns1", "llama")
    assert kube.dd is not None
    status = DisaggregatedDeploymentStatus.model_validate(kube.dd["status"])
    ready = C.find(status.conditions, C.READY)
    assert ready is not None and ready.status == "False" and ready.reason == "ReplicaDoesNotFit"
    summary = replica_fit(MODELS["deepseek-v3"], GPUS["GB200"], 4).summary()
    assert ready.message.startswith(f"prefill: {summary}")  # the same line `xpyd plan` prints
    assert not kube.objects, "nothing is created for a replica that cannot serve"
    assert ("Warning", "ReplicaDoesNotFit") in [(t, r) for t, r, _ in kube.events]


async def test_an_edit_that_does_not_fit_leaves_the_running_pools_alone() -> None:
    pool = {"replicas": 1, "gpusPerReplica": 4}
    body = {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "topology": {"kind": "HGX-B200"},
            "prefill": pool, "decode": pool}  # fmt: skip
    kube = FakeKube(body, b200_nodes())
    reconciler = Reconciler(kube, Config(own_image=IMG))
    await reconciler.reconcile("ns1", "llama")
    before = dict(kube.objects)
    assert kube.dd is not None
    kube.dd["spec"]["decode"] = {"replicas": 1, "gpusPerReplica": 1}
    await reconciler.reconcile("ns1", "llama")
    assert kube.objects == before
    reasons = {c["type"]: c["reason"] for c in kube.dd["status"]["conditions"]}
    assert reasons[C.READY] == "ReplicaDoesNotFit"
