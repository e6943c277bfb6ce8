"""Pod template patches: change anything in an engine pod the operator makes, checked when read.

A patch is applied last to the pod template ({metadata, spec}) of a pool's StatefulSet, like a
Kubernetes strategic merge patch: mappings merge key by key, `null` removes a key, and the lists
below merge item by item on their key (`containers` by name, `volumeMounts` by mountPath, ...);
any other list replaces the generated one. An item or mapping with `$patch: delete` is removed,
a mapping with `$patch: replace` replaces the generated one instead of merging with it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Final

ENGINE_CONTAINER: Final = "engine"
DIRECTIVE: Final = "$patch"
# List fields merged item by item on a key, as Kubernetes' strategic merge patch merges them.
MERGE_KEYS: Final[dict[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "claims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "topologySpreadConstraints": "topologyKey",
}
POD_SPEC_FIELDS: Final = frozenset(
    {
        "affinity",
        "automountServiceAccountToken",
        "containers",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "ephemeralContainers",
        "hostAliases",
        "hostIPC",
        "hostNetwork",
        "hostPID",
        "hostUsers",
        "hostname",
        "imagePullSecrets",
        "initContainers",
        "nodeName",
        "nodeSelector",
        "os",
        "overhead",
        "preemptionPolicy",
        "priority",
        "priorityClassName",
        "readinessGates",
        "resourceClaims",
        "resources",
        "runtimeClassName",
        "schedulerName",
        "schedulingGates",
        "securityContext",
        "serviceAccount",
        "serviceAccountName",
        "setHostnameAsFQDN",
        "shareProcessNamespace",
        "subdomain",
        "terminationGracePeriodSeconds",
        "tolerations",
        "topologySpreadConstraints",
        "volumes",
    }
)
CONTAINER_FIELDS: Final = frozenset(
    {
        "args",
        "command",
        "env",
        "envFrom",
        "image",
        "imagePullPolicy",
        "lifecycle",
        "livenessProbe",
        "name",
        "ports",
        "readinessProbe",
        "resizePolicy",
        "resources",
        "restartPolicy",
        "securityContext",
        "startupProbe",
        "stdin",
        "stdinOnce",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "tty",
        "volumeDevices",
        "volumeMounts",
        "workingDir",
    }
)
# StatefulSet pods always restart and never time out; the API server rejects these in a template.
NOT_IN_A_STATEFULSET: Final = frozenset({"restartPolicy", "activeDeadlineSeconds"})
RESERVED_LABEL_PREFIX: Final = "xpyd.io/"  # the selector and placement labels the operator owns


def _unknown(field: str, known: frozenset[str], where: str, what: str) -> str:
    close = difflib.get_close_matches(field, sorted(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{where}.{field} is not a {what} field{hint}"


def _check_container(item: Any, where: str, main: bool) -> list[str]:
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        return [f"{where} items must be mappings with a name"]
    name = item["name"]
    here = f"{where}[{name}]"
    if item.get(DIRECTIVE) == "delete":
        return [f"{here}: the engine container cannot be deleted"] if main and name == ENGINE_CONTAINER else []
    errors = [_unknown(k, CONTAINER_FIELDS, here, "container") for k in item if k not in {*CONTAINER_FIELDS, DIRECTIVE}]
    if main and name != ENGINE_CONTAINER and "image" not in item:
        errors.append(f"{here}: a new container needs an image")
    return errors


def check(patch: Any, where: str = "podTemplatePatch") -> list[str]:
    """Why this patch cannot be applied to an engine pod template; empty when it can."""
    if not isinstance(patch, Mapping):
        return [f"{where} must be a mapping with metadata and/or spec"]
    errors = [f"{where}.{k} is not allowed: a pod template has only metadata and spec" for k in patch
              if k not in ("metadata", "spec")]  # fmt: skip
    meta = patch.get("metadata") or {}
    if not isinstance(meta, Mapping):
        errors.append(f"{where}.metadata must be a mapping")
        meta = {}
    errors += [f"{where}.metadata.{k} is not allowed: only labels and annotations" for k in meta
               if k not in ("labels", "annotations")]  # fmt: skip
    for kind in ("labels", "annotations"):
        values = meta.get(kind) or {}
        if not isinstance(values, Mapping) or not all(isinstance(v, str | None) for v in values.values()):
            errors.append(f"{where}.metadata.{kind} must map names to strings")
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    reserved = [k for k in labels or {} if str(k).startswith(RESERVED_LABEL_PREFIX)]
    errors += [
        f"{where}.metadata.labels.{k}: labels under {RESERVED_LABEL_PREFIX} are the operator's" for k in reserved
    ]
    spec = patch.get("spec") or {}
    if not isinstance(spec, Mapping):
        return [*errors, f"{where}.spec must be a mapping"]
    for field in spec:
        if field in NOT_IN_A_STATEFULSET:
            errors.append(f"{where}.spec.{field} is not allowed in a StatefulSet's pods")
        elif field not in POD_SPEC_FIELDS:
            errors.append(_unknown(field, POD_SPEC_FIELDS, f"{where}.spec", "pod spec"))
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        if field in spec and not isinstance(items, list):
            errors.append(f"{where}.spec.{field} must be a list (merged by name)")
            continue
        for item in items or []:
            errors += _check_container(item, f"{where}.spec.{field}", field == "containers")
    return errors


def _key_of(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, Mapping) else None


def _merge_list(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = [dict(i) if isinstance(i, Mapping) else i for i in base]
    for item in patch:
        wanted = _key_of(item, key)
        at = next((i for i, have in enumerate(out) if wanted is not None and _key_of(have, key) == wanted), None)
        if isinstance(item, Mapping) and item.get(DIRECTIVE) == "delete":
            if at is not None:
                del out[at]
        elif at is None:
            out.append(merge({}, item))
        else:
            out[at] = merge(out[at], item)
    return out


def merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `patch` applied (neither is changed)."""
    if patch.get(DIRECTIVE) == "replace":
        return {k: v for k, v in patch.items() if k != DIRECTIVE}
    out = dict(base)
    for key, value in patch.items():
        if key == DIRECTIVE:
            continue
        if value is None or (isinstance(value, Mapping) and value.get(DIRECTIVE) == "delete"):
            out.pop(key, None)
        elif isinstance(value, Mapping):
            have = out.get(key)
            out[key] = merge(have if isinstance(have, Mapping) else {}, value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, MERGE_KEYS[key])
        elif isinstance(value, list):
            out[key] = [merge({}, i) if isinstance(i, Mapping) else i for i in value]
        else:
            out[key] = value
    return out
