"""Any model, with the model hub on: the operator fetches config.json from a loopback fake of the hub.

A model outside the catalog that the spec gives no config for is sized from the fetched config.json
as if it were given inline; with the hub off it is still refused (UnknownModel, naming the option).
A hub that fails is a Ready=False condition naming the cause and the fix, changing nothing that
runs; the answer is kept per (endpoint, model, revision), a failure for a minute.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakekube import OWNER, FakeKube, b200_nodes  # type: ignore[import-not-found]

from fakehub import FakeHub, Reply, serve  # type: ignore[import-not-found]  # tests/ is on sys.path
from xpyd_api import conditions as C
from xpyd_http import hub as hubkit
from xpyd_operator import modelhub, sizing
from xpyd_operator.desired import InputError
from xpyd_operator.modelhub import HubSettings, ModelHub
from xpyd_operator.reconcile import Config, Reconciler
from xpyd_perf import model_from_config, resolve_model

CONFIGS = Path(__file__).parents[1] / "perf" / "data" / "model-configs"
POOL = {"replicas": 1, "gpusPerReplica": 8}
GEMMA = "google/gemma-2-9b-it"
# Real config.json files of models outside the catalog, one family each.
OUTSIDE = [
    "google/gemma-2-9b-it",
    "google/gemma-3-27b-it",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "Qwen/Qwen2.5-72B-Instruct",
    "microsoft/Phi-3-mini-4k-instruct",
]


def config_text(model: str) -> bytes:
    return (CONFIGS / f"{model.replace('/', '--')}.json").read_bytes()


def body(model: str = GEMMA, **extra: Any) -> dict[str, Any]:
    return {"model": {"name": model}, "topology": {"kind": "HGX-B200"}, "prefill": POOL, "decode": POOL, **extra}


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub(files={f"{m}/main/config.json": config_text(m) for m in OUTSIDE})
    server = serve(hub)
    yield hub
    server.shutdown()
    server.server_close()


def settings(hub: FakeHub | str, **kw: Any) -> HubSettings:
    url = hub if isinstance(hub, str) else hub.url
    return HubSettings(endpoint=url, backoff_s=0.01, **kw)


async def run(kube: FakeKube, reconciler: Reconciler) -> list[str]:
    kube.writes.clear()
    await reconciler.reconcile(OWNER.namespace, OWNER.name)
    return list(kube.writes)


def ready(kube: FakeKube) -> dict[str, Any]:
    assert kube.dd is not None
    found: dict[str, Any] = next(c for c in kube.dd["status"]["conditions"] if c["type"] == C.READY)
    return found


def router_flag(kube: FakeKube, name: str) -> str:
    pod = kube.objects[("Deployment", "llama-router")]["spec"]["template"]["spec"]
    command: list[str] = next(c for c in pod["containers"] if c["name"] == "router")["command"]
    return command[command.index(name) + 1]


def asked(hub: FakeHub) -> list[str]:
    return [path for path, _ in hub.seen]


@pytest.mark.parametrize("model", OUTSIDE)
async def test_a_model_outside_the_catalog_is_sized_from_the_hubs_config(fake_hub: FakeHub, model: str) -> None:
    with pytest.raises(Exception, match="unknown model"):
        resolve_model(model)  # the premise: the catalog does not know it
    kube = FakeKube(body(model), b200_nodes())
    reconciler = Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t", model_hub=settings(fake_hub)))
    await run(kube, reconciler)
    assert ready(kube)["reason"] == "ReplicasNotReady", ready(kube)["message"]
    shape = model_from_config(json.loads(config_text(model)), model)
    assert int(router_flag(kube, "--kv-bytes-per-token")) == shape.kv_bytes_per_token
    engine = next(
        c
        for c in kube.objects[("StatefulSet", "llama-decode")]["spec"]["template"]["spec"]["containers"]
        if c["name"] == "engine"
    )
    budget = sizing.STARTUP_BASE_S + math.ceil(shape.weight_bytes / sizing.DOWNLOAD_BYTES_PER_S)
    assert engine["startupProbe"]["failureThreshold"] == math.ceil(budget / sizing.STARTUP_PERIOD_S)
    assert asked(fake_hub) == [f"/{model}/resolve/main/config.json"]
    kube.settle()
    await run(kube, reconciler)
    assert ready(kube)["reason"] == "AllReplicasReady"
    assert await run(kube, reconciler) == []  # at rest, and the hub asked once
    assert len(fake_hub.seen) == 1


async def test_with_the_hub_off_an_unknown_model_is_refused_naming_the_option() -> None:
    kube = FakeKube(body(), b200_nodes())
    await run(kube, Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t")))
    condition = ready(kube)
    assert (condition["status"], condition["reason"]) == ("False", "UnknownModel")
    assert "--model-hub" in condition["message"] and "operator.modelHub.enabled=true" in condition["message"]
    assert not kube.objects


@pytest.mark.parametrize(
    "model",
    [
        {"name": "meta-llama/Llama-3.1-8B-Instruct"},  # the catalog knows it
        {"name": GEMMA, "config": json.loads(config_text(GEMMA))},
        {"name": GEMMA, "kvBytesPerToken": 1000},
        {"name": "/models/local-checkpoint"},  # not a hub repository: refused as unknown, the hub not asked
    ],
)
async def test_the_hub_is_asked_only_when_nothing_else_knows_the_model(
    fake_hub: FakeHub, model: dict[str, Any]
) -> None:
    kube = FakeKube({**body(), "model": model}, b200_nodes())
    await run(kube, Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t", model_hub=settings(fake_hub))))
    assert fake_hub.seen == []
    assert ready(kube)["reason"] == ("UnknownModel" if model["name"].startswith("/") else "ReplicasNotReady")


async def test_the_engines_revision_and_the_token_go_to_the_hub(fake_hub: FakeHub) -> None:
    fake_hub.files[f"{GEMMA}/v2/config.json"] = config_text(GEMMA)
    kube = FakeKube(body(engine={"args": ["--revision", "v2"]}), b200_nodes())
    hub = settings(fake_hub, token="hf_secret")
    await run(kube, Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t", model_hub=hub)))
    assert ready(kube)["reason"] == "ReplicasNotReady"
    assert fake_hub.seen == [(f"/{GEMMA}/resolve/v2/config.json", "Bearer hf_secret")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once this block ends: nothing listens there


@pytest.mark.parametrize(
    ("reply", "reason", "says"),
    [
        (Reply(401, headers={"X-Error-Code": "GatedRepo"}), "ModelConfigUnavailable",
         "(HTTP 401: gated or private repository; set HF_TOKEN (chart: operator.modelHub.tokenSecret) to a token"),
        (Reply(403), "ModelConfigUnavailable", "HTTP 403: no access to this repository"),
        (Reply(404, headers={"X-Error-Code": "RepoNotFound"}), "ModelConfigUnavailable", "HTTP 404: RepoNotFound"),
        (Reply(503), "ModelConfigUnavailable", "cannot fetch config.json (HTTP 503)"),  # after 3 tries
        (Reply(200, b"{not json"), "ModelConfigInvalid", "not JSON"),
        (Reply(200, b'{"hidden_size": 4096}'), "ModelConfigInvalid", "missing key num_hidden_layers"),
        (Reply(200, b"x" * 2048), "ModelConfigUnavailable", "config.json is 2048 bytes, over the 1024 byte limit"),
    ],
)  # fmt: skip
async def test_a_hub_failure_is_a_condition_naming_the_cause_and_the_fix(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, reply: Reply, reason: str, says: str
) -> None:
    monkeypatch.setattr(modelhub, "MAX_BYTES", 1024)
    fake_hub.replies["config.json"] = [reply]
    kube = FakeKube(body(), b200_nodes())
    assert await run(kube, Reconciler(kube, Config(model_hub=settings(fake_hub)))) == ["status"]
    condition = ready(kube)
    assert (condition["status"], condition["reason"]) == ("False", reason)
    message = condition["message"]
    assert message.startswith(f"config.json of {GEMMA} at main from the model hub 127.0.0.1:"), message
    assert says in message and "or give the config.json in spec.model.configMap or spec.model.config" in message
    assert "\n" not in message and not kube.objects
    tries = 3 if reply.status == 503 else 1
    assert asked(fake_hub) == [f"/{GEMMA}/resolve/main/config.json"] * tries


async def test_an_unreachable_hub() -> None:
    port = _closed_port()
    kube = FakeKube(body(), b200_nodes())
    await run(kube, Reconciler(kube, Config(model_hub=settings(f"http://127.0.0.1:{port}"))))
    assert ready(kube)["reason"] == "ModelConfigUnavailable"
    assert f"cannot reach 127.0.0.1:{port}" in ready(kube)["message"]


async def test_a_failure_is_kept_a_minute_then_asked_again(fake_hub: FakeHub) -> None:
    now = [1000.0]
    kube = FakeKube(body(), b200_nodes())
    reconciler = Reconciler(kube, Config(own_image="ghcr.io/xpyd/xpyd:t"))
    reconciler.model_hub = ModelHub(settings(fake_hub), clock=lambda: now[0])
    fake_hub.replies["config.json"] = [Reply(404, headers={"X-Error-Code": "RepoNotFound"})]
    await run(kube, reconciler)
    assert ready(kube)["reason"] == "ModelConfigUnavailable" and "asked again after 60s" in ready(kube)["message"]
    for _ in range(3):  # reconciles within the minute: the hub is not asked, the condition stays as it is
        now[0] += 15
        assert await run(kube, reconciler) == []
    assert len(fake_hub.seen) == 1
    del fake_hub.replies["config.json"]  # the repository is there now
    now[0] += 16
    await run(kube, reconciler)
    assert ready(kube)["reason"] == "ReplicasNotReady" and len(fake_hub.seen) == 2
    now[0] += 1e6  # a good answer is kept
    await run(kube, reconciler)
    assert len(fake_hub.seen) == 2


async def test_the_cache_is_per_model_and_revision(fake_hub: FakeHub) -> None:
    model_hub = ModelHub(settings(fake_hub))
    fake_hub.files[f"{GEMMA}/v2/config.json"] = config_text(GEMMA)
    for model, revision in [(GEMMA, "main"), (GEMMA, "main"), (GEMMA, "v2"), (OUTSIDE[2], "main")]:
        await model_hub.config(model, revision)
    assert model_hub.fetches == 3
    assert sorted(asked(fake_hub)) == sorted(
        f"/{m}/resolve/{r}/config.json" for m, r in [(GEMMA, "main"), (GEMMA, "v2"), (OUTSIDE[2], "main")]
    )


async def test_reconciles_of_one_model_share_a_fetch() -> None:
    calls: list[str] = []

    def slow(model: str, revision: str, options: hubkit.FetchOptions) -> bytes:
        calls.append(model)
        time.sleep(0.2)
        return config_text(GEMMA)

    model_hub = ModelHub(HubSettings(endpoint="http://127.0.0.1:9"), fetcher=slow)
    configs = await asyncio.gather(*(model_hub.config(GEMMA, "main") for _ in range(4)))
    assert calls == [GEMMA] and all(c == configs[0] for c in configs)


async def test_a_hung_fetch_is_given_up_on_at_the_deadline() -> None:
    release = threading.Event()

    def hung(model: str, revision: str, options: hubkit.FetchOptions) -> bytes:
        release.wait(30)  # a DNS lookup that never returns: no socket timeout covers it
        return b"{}"

    model_hub = ModelHub(HubSettings(endpoint="http://127.0.0.1:9", deadline_s=0.2), fetcher=hung)
    start = time.monotonic()
    with pytest.raises(InputError, match=r"no answer within 0\.2s") as caught:
        await model_hub.config(GEMMA, "main")
    release.set()
    assert time.monotonic() - start < 3.0 and caught.value.reason == "ModelConfigUnavailable"


async def test_a_revision_that_is_not_one() -> None:
    with pytest.raises(InputError, match="not a branch, tag or commit"):
        await ModelHub(HubSettings()).config(GEMMA, "v1..v2")
