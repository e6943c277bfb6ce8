"""Names, labels, owner references and the applied-hash every child manifest carries."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from xpyd_api import labels as L


def version() -> str:
    try:
        return metadata.version("xpyd")
    except metadata.PackageNotFoundError:  # pragma: no cover - only outside an install
        return "0.0.0"


def default_own_image() -> str:
    return f"{L.OWN_IMAGE}:{version()}"


@dataclass(frozen=True)
class Owner:
    """The DisaggregatedDeployment the children belong to."""

    name: str
    namespace: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def ref(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{L.GROUP}/{L.VERSION}",
            "kind": L.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector(owner: Owner, role: str) -> dict[str, str]:
    return {L.DEPLOYMENT: owner.name, L.ROLE: role}


def labels_for(owner: Owner, role: str) -> dict[str, str]:
    return {**selector(owner, role), L.COMPONENT: role, L.APP_NAME: "xpyd", L.MANAGED_BY: L.MANAGER}


def child_name(owner: Owner, role: str) -> str:
    return f"{owner.name}-{role}"


def metadata_for(owner: Owner, name: str, role: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels_for(owner, role),
        "ownerReferences": [owner.ref()],
    }


def manifest_hash(manifest: dict[str, Any]) -> str:
    """A stable hash of a manifest without its own hash annotation."""
    body = json.loads(json.dumps(manifest))
    meta = body.get("metadata", {})
    meta.get("annotations", {}).pop(L.APPLIED_HASH, None)
    if meta.get("annotations") == {}:
        del meta["annotations"]
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def stamp(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its applied-hash annotation set."""
    digest = manifest_hash(manifest)
    meta = manifest.setdefault("metadata", {})
    meta.setdefault("annotations", {})[L.APPLIED_HASH] = digest
    return manifest


def kind_key(manifest: dict[str, Any]) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]
