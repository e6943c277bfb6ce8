"""Every kvOffload flag and connector xpyd renders for a release exists in that release's own wheel.

The shapes of tests/contract/test_engine_contract.py with a CPU tier on each pool: an aggregated
pool takes vLLM's --kv-offloading-* flags (or SGLang's HiCache flags), a prefill/decode pool a
MultiConnector whose children must be connectors the release registers, with KVTransferConfig keys,
and extra-config keys its offloading code reads. A release whose profile says "none" is refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from contract.test_engine_contract import (  # type: ignore[import-not-found]  # tests/ is on sys.path
    RELEASES,
    _containers,
    _doc,
    _problems,
    argv,
    flag_values,
    profile,
)
from contract.wheels import EngineRelease, facts, sources  # type: ignore[import-not-found]
from xpyd_operator.engines import offload
from xpyd_operator.render import Options, RenderError, render_objects

pytestmark = pytest.mark.engine_wheels

SHAPES = ("1p1d", "colocated", "data-parallel")
FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
# The size key xpyd renders into each offloading connector's kv_connector_extra_config, and what the release's
# own code must say to read it: OffloadingConnector reads its key by name; vLLM's LMCache adapter hands every
# "lmcache."-prefixed key on to LMCache's own config (whose max_local_cpu_size it is).
OFFLOAD_KEYS = {
    "OffloadingConnector": ("cpu_bytes_to_use", '"cpu_bytes_to_use"'),
    "LMCacheConnectorV1": ("lmcache.max_local_cpu_size", 'startswith("lmcache.")'),
}


def _with_tier(shape: str, release: EngineRelease, backend: str) -> dict[str, Any]:
    doc: dict[str, Any] = _doc(shape, release)
    for role in ("prefill", "decode", "worker"):
        if role in doc["spec"]:
            doc["spec"][role]["kvOffload"] = {"cpuMemory": "64Gi", "backend": backend}
    return doc


def _backends(release: EngineRelease) -> list[str]:
    return ["native", "lmcache"] if release.kind == "vllm" else ["native"]


def _cases() -> list[tuple[EngineRelease, str, str]]:
    return [(r, s, b) for r in RELEASES for s in SHAPES for b in _backends(r)]


def _child_problems(release: EngineRelease, where: str, raw: dict[str, Any]) -> list[str]:
    f = facts(release)
    factory = sources(release).text(FACTORY)
    fields = f.configs.get("KVTransferConfig", ())
    out = []
    if f'"{raw["kv_connector"]}"' not in factory:
        out.append(f"{where}: {release} registers no {raw['kv_connector']}")
    for child in (raw.get("kv_connector_extra_config") or {}).get("connectors", []):
        name = child["kv_connector"]
        if f'"{name}"' not in factory:
            out.append(f"{where}: {release} registers no connector {name}")
        out += [
            f"{where}: {name} key {k!r} is no KVTransferConfig field of {release}" for k in child if k not in fields
        ]
        if (known := OFFLOAD_KEYS.get(name)) is not None:
            key, needle = known
            readers = sources(release).containing(sources(release).under("vllm/"), needle)
            if key not in (child.get("kv_connector_extra_config") or {}) or not readers:
                out.append(f"{where}: {name}'s {key!r} is not read by {release}")
    return out


@pytest.mark.parametrize(("release", "shape", "backend"), _cases(), ids=str)
def test_rendered_offload_is_accepted(release: EngineRelease, shape: str, backend: str) -> None:
    doc = _with_tier(shape, release, backend)
    if profile(release).kv_offload == "none":
        with pytest.raises(RenderError, match=f"kvOffload needs vllm {offload.__name__ and '0.14.0'} or newer"):
            render_objects(doc, Options())
        return
    _, objects = render_objects(doc, Options())
    found = list(_containers(objects, release.image))
    assert found
    f = facts(release)
    problems = [p for where, c in found for p in _problems(release, f, where, c)]
    rendered = set()
    for where, c in found:
        words = argv(c)
        rendered |= {flag for flag, _ in flag_values(words)}
        for flag, value in flag_values(words):
            if flag == "--kv-transfer-config" and value and json.loads(value)["kv_connector"] == "MultiConnector":
                rendered.add("MultiConnector")
                problems += _child_problems(release, where, json.loads(value))
    assert not problems, "\n".join(dict.fromkeys(problems))
    tier = {offload.SIZE_FLAG, *offload.HICACHE_FLAGS, "MultiConnector"} & rendered
    assert tier, f"no CPU tier rendered for {release} {shape}"  # the test checks something
