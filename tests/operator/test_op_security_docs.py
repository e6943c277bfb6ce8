"""docs/security.md says what the builders do: Pod Security levels, fabric capabilities, the router's Role."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fakekube import OWNER, spec  # type: ignore[import-not-found]
from pss import level  # type: ignore[import-not-found]

from xpyd_operator import podsecurity, pools, routerkit
from xpyd_operator.build_context import PoolBuild

REPO = Path(__file__).resolve().parents[2]
SECURITY = (REPO / "docs" / "security.md").read_text()
IMG = "ghcr.io/xpyd/xpyd:test"
RDMA = {"rdma/ib": "1"}


def table(marker: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table right after an HTML comment naming marker."""
    lines = SECURITY.split(f"<!-- {marker}", 1)[1].splitlines()[1:]
    rows = lines[: next(i for i, s in enumerate(lines) if not s.startswith("|"))]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _engine_level(kind: str, resources: dict[str, str]) -> str:
    s = spec(engine={"kind": kind, "resources": resources})
    assert s.decode is not None
    return str(level(pools.pod_template(PoolBuild(OWNER, s, "decode", IMG))["spec"]))


def documented_levels() -> list[tuple[str, str, bool, str]]:
    """(pod, engine kind, with RDMA, level) for every engine kind a row names."""
    out = []
    for pod, engines, lvl in table("pod-security-levels"):
        kinds = codes(engines) or ["vllm", "sglang", "emulator"]
        for kind in kinds:
            out.append((pod, kind, "RDMA" in engines, codes(lvl)[0]))
    return out


def test_levels_table_covers_every_pod_and_engine() -> None:
    rows = documented_levels()
    assert {r[0] for r in rows} == {"router", "engine"}
    assert {(r[1], r[2]) for r in rows if r[0] == "engine"} >= {
        ("emulator", False), ("vllm", False), ("sglang", False), ("vllm", True), ("sglang", True)
    }  # fmt: skip


@pytest.mark.parametrize(("pod", "kind", "rdma", "want"), documented_levels())
def test_documented_level_is_the_builders_level(pod: str, kind: str, rdma: bool, want: str) -> None:
    if pod == "router":
        got = level(routerkit.deployment(OWNER, spec(engine={"kind": kind}), IMG)["spec"]["template"]["spec"])
    else:
        got = _engine_level(kind, RDMA if rdma else {})
    assert got == want


@pytest.mark.parametrize("row", table("fabric-capabilities"), ids=lambda r: r[0][:30])
def test_documented_fabric_capabilities(row: list[str]) -> None:
    _, resource, caps = row
    resources = codes(resource)[:1]
    want = codes(caps)
    assert podsecurity.fabric_capabilities(resources) == want
    s = spec(engine={"kind": "vllm", "resources": dict.fromkeys(resources, "1")})
    assert s.decode is not None
    container = pools.pod_template(PoolBuild(OWNER, s, "decode", IMG))["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"].get("add", []) == want


def test_router_role_table_is_the_builders_role() -> None:
    documented: set[tuple[str, str, str]] = set()
    for group, resources, verbs in table("router-role"):
        api_group = codes(group)[0].strip('"')
        for resource in codes(resources):
            documented |= {(api_group, resource, v.strip()) for v in verbs.split(",")}
    built: set[tuple[str, str, str]] = {
        (g, r, v) for rule in routerkit.role(OWNER)["rules"] for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip
    assert documented == built


def test_architecture_describes_the_router_role_as_built() -> None:
    """docs/architecture.md's router paragraph names what the Role grants, and nothing it does not."""
    text = (REPO / "docs" / "architecture.md").read_text()
    router = text.split("## Router", 1)[1].split("\n## ", 1)[0]
    granted = {r for rule in routerkit.RULES for r in rule["resources"]}
    assert all(resource in router for resource in granted)
    assert "its DisaggregatedDeployment" not in router


def _router_pod() -> dict[str, Any]:
    return dict(routerkit.deployment(OWNER, spec(), IMG)["spec"]["template"]["spec"])


def test_router_numbers_in_the_docs_match() -> None:
    resources = _router_pod()["containers"][0]["resources"]
    req, lim = resources["requests"], resources["limits"]
    assert f"Requests `cpu: {req['cpu']}, memory: {req['memory']}`" in SECURITY
    assert f"limits `cpu: {lim['cpu']}, memory: {lim['memory']}`" in SECURITY
    assert f"user and group {podsecurity.RUN_AS}" in SECURITY
    assert podsecurity.TMP_SIZE.replace("Mi", " MiB") in SECURITY
