"""What the operator renders for each supported engine release must be accepted by that release.

Every engine container's `--flag`, VLLM_/SGLANG_/SGL_ env var, `--kv-transfer-config` and
`--kv-events-config` key is checked against the release's own wheel (tests/contract/wheels.py), for a
matrix of DisaggregatedDeployment shapes; so are the metric names xpyd reads and the endpoints the
router and emulator rely on. A shape the operator refuses is asserted refused, with its message.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.wheels import (  # type: ignore[import-not-found]  # tests/ is on sys.path
    EngineFacts,
    EngineRelease,
    facts,
    sources,
)
from xpyd_api import engines, metric_names
from xpyd_operator.render import Options, RenderError, render_objects

pytestmark = pytest.mark.engine_wheels

# Every release the engine profiles list as checked: a new entry brings its wheel under this contract.
RELEASES = [EngineRelease(kind, v) for kind in ("vllm", "sglang") for v in engines.supported_releases(kind)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV_PREFIXES = ("VLLM_", "SGLANG_", "SGL_")

# Shapes the operator refuses for an engine kind: (shape, kind) -> a fragment of the refusal message.
REFUSED: dict[tuple[str, str], str] = {}


def _example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    return doc


def _one_p_one_d() -> dict[str, Any]:
    doc = _example("llama-70b-hgx-b200.yaml")
    for role in ("prefill", "decode"):
        doc["spec"][role] |= {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 1}}
    return doc


def _data_parallel() -> dict[str, Any]:
    doc = _one_p_one_d()
    for role in ("prefill", "decode"):
        doc["spec"][role] |= {"gpusPerReplica": 8, "tensorParallelSize": 4, "dataParallelSize": 2}
    return doc


def _expert_parallel() -> dict[str, Any]:
    doc = _example("deepseek-r1-wide-ep-hgx-b200.yaml")
    for role in ("prefill", "decode"):
        doc["spec"][role] |= {"gpusPerReplica": 8, "dataParallelSize": 8, "expertParallel": True}
    return doc


SHAPES: dict[str, Callable[[], dict[str, Any]]] = {
    "1p1d": _one_p_one_d,
    "data-parallel": _data_parallel,
    "expert-parallel": _expert_parallel,
    "lws-gb200-nvl72": lambda: _example("deepseek-r1-gb200-nvl72.yaml"),
    "lws-wide-ep-b200": lambda: _example("deepseek-r1-wide-ep-hgx-b200.yaml"),
    "colocated": lambda: _example("colocated-h100.yaml"),
}


def _doc(shape: str, release: EngineRelease) -> dict[str, Any]:
    doc = copy.deepcopy(SHAPES[shape]())
    engine = doc["spec"].setdefault("engine", {})
    if release.kind == "sglang":  # the examples' args, env and connector are vLLM's
        engine.clear()
    elif engine.get("image") != release.image:  # the user's args and env are for the example's own release
        engine.pop("args", None)
        engine.pop("env", None)
    engine |= {"kind": release.kind, "image": release.image}
    if profile(release).kv_offload == "none":  # the example's CPU KV tier needs a release that renders one
        for role in ("prefill", "decode", "worker"):
            (doc["spec"].get(role) or {}).pop("kvOffload", None)
    return doc


def _containers(objects: list[dict[str, Any]], image: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object/container, container) of every container running the engine image."""
    for obj in objects:
        spec = obj.get("spec") or {}
        templates = [spec.get("template")]
        if obj.get("kind") == "LeaderWorkerSet":
            lw = spec.get("leaderWorkerTemplate") or {}
            templates = [lw.get("leaderTemplate"), lw.get("workerTemplate")]
        for t in templates:
            pod = (t or {}).get("spec") or {}
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                if c.get("image") == image or c.get("name") == "engine":
                    yield f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", c


def argv(container: dict[str, Any]) -> list[str]:
    """The engine's words: command + args, a `/bin/sh -c 'exec ...'` script split as the shell would."""
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    if len(words) >= 3 and words[0].endswith("sh") and words[1] == "-c":
        return shlex.split(words[2]) + words[3:]
    return words


def flag_values(words: list[str]) -> Iterator[tuple[str, str | None]]:
    """(--flag, its value or None) for every flag word; `--flag=value` split."""
    for i, w in enumerate(words):
        if w.startswith("--") and len(w) > 2:
            name, eq, value = w.partition("=")
            nxt = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            yield name.replace("_", "-"), value if eq else nxt


def _problems(release: EngineRelease, f: EngineFacts, where: str, container: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if container.get("image") != release.image:
        out.append(f"{where}: image {container.get('image')!r}, spec asked for {release.image!r}")
    words = argv(container)
    for flag, value in flag_values(words):
        if flag not in f.flags:
            out.append(f"{where}: {release} has no flag {flag}")
            continue
        choices = f.flag_choices.get(flag)
        if (
            choices
            and value is not None
            and not value.startswith("$")
            and value.lower().replace("-", "_") not in {c.lower() for c in choices}
        ):
            out.append(f"{where}: {flag} {value!r} is not one of {release}'s {list(choices)}")
        if flag in f.deprecated_flags:
            out.append(f"{where}: {flag} is deprecated in {release}: {f.deprecated_flags[flag]}")
        if flag in ("--kv-transfer-config", "--kv-events-config") and value is not None:
            out += _config_problems(release, f, where, flag, value)
    env_known = f.env | f.env_read if release.kind == "sglang" else f.env
    for e in container.get("env") or []:
        name = e.get("name", "")
        if name.startswith(ENV_PREFIXES) and name not in env_known:
            hint = f" ({f.removed_env[name]})" if name in f.removed_env else ""
            out.append(f"{where}: {release} does not read env {name}{hint}")
    return out


def _config_problems(release: EngineRelease, f: EngineFacts, where: str, flag: str, value: str) -> list[str]:
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as exc:
        return [f"{where}: {flag} is not JSON: {exc}"]
    cls = "KVTransferConfig" if flag == "--kv-transfer-config" else "KVEventsConfig"
    fields = f.configs.get(cls)
    if fields is None:
        return [f"{where}: {release} has no {cls} to check {flag} against"]
    out = [f"{where}: {flag} key {k!r} is not a field of {release}'s {cls}" for k in raw if k not in fields]
    roles = f.literals.get("KVTransferConfig.kv_role", ())
    if cls == "KVTransferConfig" and raw.get("kv_role") not in roles:
        out.append(f"{where}: kv_role {raw.get('kv_role')!r} is not one of {release}'s {list(roles)}")
    if cls == "KVTransferConfig" and raw.get("kv_role") == "kv_both" and kv_both_deprecated(release):
        out.append(f"{where}: kv_role 'kv_both' with NixlConnector is deprecated in {release}")
    return out


def kv_both_deprecated(release: EngineRelease) -> bool:
    """Whether the release's NixlConnector warns that kv_role kv_both is deprecated (vLLM 0.23 on)."""
    src = sources(release)
    nixl = src.under("vllm/distributed/kv_transfer/kv_connector/v1/nixl")
    return any("kv_both" in line and "deprecated" in line for p in nixl for line in src.text(p).splitlines())


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("release", RELEASES, ids=str)
def test_rendered_engine_command_is_accepted(release: EngineRelease, shape: str) -> None:
    doc = _doc(shape, release)
    refused = REFUSED.get((shape, release.kind))
    if refused is not None:
        with pytest.raises(RenderError, match=refused):
            render_objects(doc, Options())
        return
    _, objects = render_objects(doc, Options())
    found = list(_containers(objects, release.image))
    assert found, f"no engine container in {[o['kind'] for o in objects]}"
    f = facts(release)
    problems = [p for where, c in found for p in _problems(release, f, where, c)]
    assert not problems, "\n".join(dict.fromkeys(problems))


VLLM_READ = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str) and v.startswith("vllm:")}
SGLANG_READ = {v for k, v in vars(metric_names).items() if isinstance(v, str) and v.startswith("sglang:")}
OLD_NAMES = {metric_names.KV_USAGE_OLD}  # read as a fallback: present in older releases only


def profile(release: EngineRelease) -> engines.EngineProfile:
    version = engines.parse_version(release.version)
    assert version is not None, release
    return engines.for_version(release.kind, version)


def metric_problems(names: engines.MetricNames, exposed: frozenset[str]) -> list[str]:
    """The names of a profile's metric map that the release does not export (kv_usage: none of its names)."""
    single = [getattr(names, f) for f in ("waiting", "running", "ttft", "itl", "e2e", "queue_time", "prompt_tokens",
                                          "generation_tokens", "prompt_length", "prefix_queries", "prefix_hits",
                                          "cache_hit_rate", "kv_transfers", "kv_transfer_bytes",
                                          "kv_transfer_failures")]  # fmt: skip
    out = [f"{n} is not exported" for n in single if n is not None and n not in exposed]
    if not set(names.kv_usage) & exposed:
        out.append(f"none of {list(names.kv_usage)} is exported")
    return out


@pytest.mark.parametrize("release", RELEASES, ids=str)
def test_metric_names_xpyd_reads_are_exported(release: EngineRelease) -> None:
    """The profile's map (the autoscaler, drain hook, dashboards and scraper read it) and the names in
    xpyd_api.metric_names all name series the release exports."""
    exposed = facts(release).exposed_metrics
    assert not metric_problems(profile(release).metrics, exposed), metric_problems(profile(release).metrics, exposed)
    read = VLLM_READ - OLD_NAMES if release.kind == "vllm" else SGLANG_READ
    assert not read - exposed, sorted(read - exposed)


ROUTER_CALLS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
EMULATOR_SERVES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ping", "/version", "/metrics",
                   "/reset_prefix_cache")  # fmt: skip


@pytest.mark.parametrize("release", RELEASES, ids=str)
def test_endpoints_the_router_calls_exist(release: EngineRelease) -> None:
    missing = set(ROUTER_CALLS) - facts(release).endpoints
    assert not missing, sorted(missing)


@pytest.mark.parametrize("release", [r for r in RELEASES if r.kind == "vllm"], ids=str)
def test_endpoints_the_emulator_serves_are_vllms(release: EngineRelease) -> None:
    missing = set(EMULATOR_SERVES) - facts(release).endpoints
    assert not missing, sorted(missing)


# --- the test of the test: the same checks flag what a release lacks ---


def _container(argv: list[str], env: dict[str, str], image: str) -> dict[str, Any]:
    return {"name": "engine", "image": image, "command": argv, "env": [{"name": k, "value": v} for k, v in env.items()]}


def test_the_contract_flags_what_a_release_lacks() -> None:
    old, new = EngineRelease("vllm", "0.11.0"), EngineRelease("vllm", engines.supported_releases("vllm")[0])
    kv_both = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    made_up = ["vllm", "serve", "m", "--no-such-flag", "1", "--all2all-backend", "deepep_low_latency",
               "--kv-transfer-config", kv_both, "--kv-events-config", json.dumps({"no_such_key": 1})]  # fmt: skip
    on_old = _problems(old, facts(old), "c", _container(made_up, {"VLLM_NO_SUCH_VAR": "1"}, old.image))
    assert any("no flag --no-such-flag" in p for p in on_old)
    assert any("no flag --all2all-backend" in p for p in on_old)  # 0.11.0 took VLLM_ALL2ALL_BACKEND
    assert any("does not read env VLLM_NO_SUCH_VAR" in p for p in on_old)
    assert any("'no_such_key' is not a field" in p for p in on_old)
    assert not any("kv_both" in p for p in on_old)  # not yet deprecated there
    on_new = _problems(new, facts(new), "c", _container(made_up, {"VLLM_ALL2ALL_BACKEND": "deepep"}, new.image))
    assert not any("--all2all-backend" in p for p in on_new)
    assert any("does not read env VLLM_ALL2ALL_BACKEND" in p for p in on_new)
    assert any("kv_both' with NixlConnector is deprecated" in p for p in on_new)
    choice = _problems(new, facts(new), "c", _container(["vllm", "serve", "m", "--all2all-backend", "nope"], {},
                                                       new.image))  # fmt: skip
    assert any("'nope' is not one of" in p for p in choice)
    sglang = EngineRelease("sglang", "0.5.3")
    assert any("no flag --attn-dp-size" in p for p in _problems(sglang, facts(sglang), "c", _container(
        ["python3", "-m", "sglang.launch_server", "--attn-dp-size", "2"], {}, sglang.image)))  # fmt: skip


def test_the_contract_flags_a_metric_a_release_does_not_export() -> None:
    release = EngineRelease("vllm", "0.11.0")
    exposed = facts(release).exposed_metrics
    assert metric_problems(engines.VLLM_METRICS, exposed) == [
        f"{n} is not exported"
        for n in ("vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred", "vllm:nixl_num_failed_transfers_total")
    ]
    made_up = engines.MetricNames(**{**_fields(engines.VLLM_METRICS), "waiting": "vllm:no_such_metric"})
    assert "vllm:no_such_metric is not exported" in metric_problems(made_up, exposed)


def _fields(names: engines.MetricNames) -> dict[str, Any]:
    return {f: getattr(names, f) for f in names.__dataclass_fields__}
