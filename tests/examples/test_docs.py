"""docs/configure.md documents every spec field of the API models (so the docs cannot fall behind)."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from xpyd_api.models import DisaggregatedDeploymentSpec

REPO = Path(__file__).resolve().parents[2]
CONFIGURE = REPO / "docs" / "configure.md"
POOLS = ("prefill", "decode", "worker")


def _models(annotation: object) -> list[type[BaseModel]]:
    """Pydantic models inside an annotation (X, X | None, list[X])."""
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            out.append(arg)
        elif typing.get_origin(arg) is list:
            out += [m for m in _models(arg) if m not in out]
    return out


def field_paths(model: type[BaseModel] = DisaggregatedDeploymentSpec, prefix: str = "spec") -> list[str]:
    """Every field as a dotted path with camelCase names; list items as `[]`, pools as `<pool>`."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        paths.append(path)
        listed = typing.get_origin(info.annotation) is list or any(
            typing.get_origin(a) is list for a in typing.get_args(info.annotation)
        )
        for sub in _models(info.annotation):
            paths += field_paths(sub, f"{path}[]" if listed else path)
    out: list[str] = []
    for path in paths:
        for pool in POOLS:
            path = path.replace(f"spec.{pool}.", "spec.<pool>.")
        if path not in out:
            out.append(path)
    return out


def test_field_paths_cover_nested_models() -> None:
    paths = field_paths()
    assert "spec.model.kvBytesPerToken" in paths
    assert "spec.engine.env[].name" in paths
    assert "spec.<pool>.autoscaling.maxReplicas" in paths
    assert "spec.prefill" in paths


def test_configure_md_documents_every_spec_field() -> None:
    text = CONFIGURE.read_text()
    missing = [path for path in field_paths() if f"`{path}`" not in text]
    assert not missing, f"docs/configure.md does not document: {missing}"
