"""The engine seam: which profile serves a spec's engine, and what a kind or release it cannot serve says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fakekube import OWNER, b200_nodes, spec  # type: ignore[import-not-found]

from xpyd_api import engines
from xpyd_api.engines import EngineUnsupported
from xpyd_operator import engine
from xpyd_operator.build_context import PoolBuild
from xpyd_operator.desired import Observed, desire

IMG = "ghcr.io/xpyd/xpyd:test"


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.14.0", (0, 14, 0)),
        ("vllm/vllm-openai:0.14.1", (0, 14, 1)),
        ("registry:5000/vllm-openai:v1.2.3-cu129", (1, 2, 3)),
        ("vllm/vllm-openai:v0.14.0@sha256:" + "a" * 64, (0, 14, 0)),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai", None),
        ("registry:5000/vllm", None),  # the port is no tag
        ("registry:5000/vllm@sha256:" + "b" * 64, None),
    ],
)
def test_image_version(image: str, version: tuple[int, int, int] | None) -> None:
    assert engines.image_version(image) == version


@pytest.mark.parametrize(
    ("kind", "image", "version", "since"),
    [
        ("vllm", None, None, engines.KV_SPLIT_VLLM),  # the default image: the newest profile
        ("vllm", "vllm/vllm-openai:v0.33.0", None, engines.KV_SPLIT_VLLM),
        ("vllm", "vllm/vllm-openai:v0.33.4", None, engines.KV_SPLIT_VLLM),  # a patch release of a checked minor
        ("vllm", "vllm/vllm-openai:v0.23.0", None, (0, 23, 0)),  # the first to deprecate kv_both (its wheel)
        ("vllm", "vllm/vllm-openai:v0.22.1", None, (0, 14, 0)),
        ("vllm", "vllm/vllm-openai:v0.20.1", None, (0, 14, 0)),
        ("vllm", "vllm/vllm-openai:v0.11.2", None, (0, 11, 1)),
        ("vllm", "vllm/vllm-openai:v0.11.0", None, (0, 11, 0)),
        ("vllm", "my.registry/vllm:prod", "0.13.0", (0, 11, 1)),  # the version wins over a tag without one
        ("vllm", "vllm/vllm-openai:v0.33.0", "v0.11.0", (0, 11, 0)),  # and over one with one
        ("sglang", None, None, (0, 5, 23)),
        ("sglang", "lmsysorg/sglang:v0.5.10", None, (0, 5, 3)),
        ("emulator", None, None, (0, 0, 0)),
        ("emulator", "anything:at-all", None, (0, 0, 0)),
    ],
)
def test_resolve(kind: str, image: str | None, version: str | None, since: tuple[int, int, int]) -> None:
    profile = engines.resolve(kind, image, version)
    assert (profile.kind, profile.since) == (kind, since)


@pytest.mark.parametrize(
    ("kind", "image", "version", "message"),
    [
        ("vllm", "my.registry/vllm:prod", None, "names no vllm version in its tag; set spec.engine.version"),
        ("vllm", "vllm/vllm-openai@sha256:" + "c" * 64, None, "set spec.engine.version"),
        ("vllm", "vllm/vllm-openai:v0.9.2", None, "older than the oldest release xpyd serves (vllm 0.11.0)"),
        ("vllm", "vllm/vllm-openai:v0.99.0", None, "newer than the newest release xpyd has checked (vllm 0.34.0)"),
        ("sglang", "lmsysorg/sglang:v0.4.9", None, "older than the oldest release xpyd serves (sglang 0.5.3)"),
        ("tensorrt-llm", None, None, "engine kind 'tensorrt-llm' is not served"),
    ],
)
def test_a_kind_or_release_xpyd_cannot_serve_is_named(kind: str, image: str | None, version: str | None,
                                                       message: str) -> None:  # fmt: skip
    with pytest.raises(EngineUnsupported, match=message.replace("(", r"\(").replace(")", r"\)")):
        engines.resolve(kind, image, version)


def test_every_profile_lists_the_releases_it_was_checked_against() -> None:
    for kind in ("vllm", "sglang"):
        releases = engines.supported_releases(kind)
        assert releases, kind
        for release in releases:  # each checked release resolves to the profile that lists it
            parsed = engines.parse_version(release)
            assert parsed is not None
            assert release in engines.for_version(kind, parsed).released
    assert engines.default_image("vllm").endswith(":v" + engines.supported_releases("vllm")[0])


def test_an_unservable_engine_is_a_condition_and_applies_nothing() -> None:
    body = {"engine": {"kind": "vllm", "image": "my.registry/vllm:prod"}}
    desired = desire(OWNER, spec(**body), Observed(nodes=b200_nodes(2)), IMG, IMG)
    assert desired.children == [] and desired.error is not None
    assert desired.error[0] == "EngineUnsupported" and "spec.engine.version" in desired.error[1]


@pytest.mark.parametrize(
    ("kind", "role", "busy"),
    [
        ("vllm", "decode", "vllm:num_requests_running"),
        ("vllm", "prefill", "vllm:num_requests_running|vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"),
        ("sglang", "decode", "sglang:num_running_reqs"),
        ("sglang", "prefill", "sglang:num_running_reqs|sglang:token_usage"),
    ],
)
def test_the_drain_hook_waits_on_the_engines_own_metrics(kind: str, role: str, busy: str) -> None:
    """Running requests; on prefill also KV in use (blocks held until decode has read them)."""
    s = spec(engine={"kind": kind})
    hook = engine.container(PoolBuild(OWNER, s, role, IMG))["lifecycle"]["preStop"]["exec"]["command"]
    assert f"grep -E '^({busy})[ {{]'" in hook[2]


@pytest.mark.parametrize(
    ("page", "waits"),
    [
        ('vllm:num_requests_running{e="0"} 0.0\nvllm:kv_cache_usage_perc{e="0"} 0.0\n', False),
        ('vllm:num_requests_running{e="0"} 0.0\nvllm:kv_cache_usage_perc{e="0"} 0.0012\n', True),
        ('vllm:num_requests_running{e="0"} 2.0\nvllm:kv_cache_usage_perc{e="0"} 0.0\n', True),
        ("vllm:num_requests_running_total 7\nvllm:kv_cache_usage_perc 0\n", False),  # another metric's prefix
        ("", False),  # the engine is gone: nothing to wait for
    ],
)
def test_the_drain_hook_runs_in_a_shell_against_a_metrics_page(tmp_path: Path, page: str, waits: bool) -> None:
    """The hook as /bin/sh runs it, `curl` answering with `page`: it waits (here: runs out its 1 s) or exits."""
    (tmp_path / "metrics").write_text(page)
    (tmp_path / "curl").write_text(f"#!/bin/sh\ncat {tmp_path / 'metrics'}\n")
    (tmp_path / "curl").chmod(0o755)
    (tmp_path / "sleep").write_text("#!/bin/sh\n")  # no waiting in a unit test
    (tmp_path / "sleep").chmod(0o755)
    hook = engine.drain_hook(spec(engine={"drainSeconds": 6}), "prefill")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    loops = subprocess.run(["/bin/sh", "-xc", hook], env=env, capture_output=True, text=True, timeout=10)
    assert loops.returncode == 0, loops.stderr
    assert ("i=1" in loops.stderr) is waits, loops.stderr


@pytest.mark.parametrize(
    ("engine_spec", "message"),
    [
        ({"kind": "sglang", "kvTransferConfig": {"kv_buffer_device": "cpu"}}, "kvTransferConfig is vLLM's"),
        ({"kvTransferConfig": {"kv_role": "kv_both"}}, "may not set kv_role"),
        ({"version": "latest"}, "String should match pattern"),
    ],
)
def test_engine_fields_refused_at_the_boundary(engine_spec: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        spec(engine=engine_spec)
