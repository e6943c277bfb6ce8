"""Engine revisions, and the decode-first order of an engine change on LeaderWorkerSet pools.

A prefill worker hands its KV cache to a decode worker, so the two ends must run engines that
agree on the connector's wire format. The router only pairs workers of the same engine revision
(the pod label `xpyd.io/engine-rev`). StatefulSet pools step through an engine change together
(xpyd_operator.lockstep). When a pool is a LeaderWorkerSet, the operator rolls one pool at a time:
while the decode workload is still replacing pods, a changed prefill template is held back (the old
prefill keeps serving with the old decode pods), and is applied once every decode replica runs the
new revision and is ready. Pure functions of the manifests; the reconciler calls them.
"""

from __future__ import annotations

from typing import Any

from xpyd_api import handoff
from xpyd_api import labels as L
from xpyd_operator import groups

FIRST, THEN = "decode", "prefill"  # the order pools take a new engine revision


def engine_rev(image: str, connector: str | None, facts: handoff.HandoffFacts | None = None) -> str:
    """A short label-safe revision of what must match across a KV handoff: the engine image and connector,
    and with `facts` (xpyd_api.handoff.pool_facts) the release, model, block size, KV dtype and layout,
    tensor and pipeline parallel, attention backend and GPU; not what leaves the handoff alone (--max-num-seqs)."""
    return handoff.revision(image, connector, facts)


def _template_rev(workload: dict[str, Any] | None) -> str | None:
    if workload is None:
        return None
    meta = groups.api_template(workload).get("metadata", {})
    rev = (meta.get("labels") or {}).get(L.ENGINE_REV)
    return str(rev) if rev is not None else None


def rolled_out(workload: dict[str, Any] | None, rev: str | None) -> bool:
    """Every replica of the observed workload runs template revision `rev` and is ready."""
    if workload is None or _template_rev(workload) != rev:
        return False
    return groups.rolled(workload)[1]


def held_back(
    desired: dict[tuple[str, str], dict[str, Any]],
    observed: dict[tuple[str, str], dict[str, Any]],
    first: str,
    then: str,
) -> bool:
    """Whether the `then` pool's new engine revision must wait for `first` to finish rolling.

    `first` and `then` are the workload names (StatefulSet or LeaderWorkerSet) of the decode and prefill pools.
    """
    want_then, have_then = groups.by_name(desired, then), groups.by_name(observed, then)
    if want_then is None or have_then is None:
        return False  # a new pool has nothing to stay compatible with
    want_first = groups.by_name(desired, first)
    if want_first is None:
        return False
    if ("StatefulSet", then) in desired and ("StatefulSet", first) in desired:
        return False  # both pools step together (xpyd_operator.lockstep)
    new_rev = _template_rev(want_then)
    if new_rev == _template_rev(have_then):
        return False  # not an engine change (a resize or another edit): apply as usual
    return not rolled_out(groups.by_name(observed, first), _template_rev(want_first))


def serving_revisions(pods: list[dict[str, Any]], role: str, by: str = "") -> dict[str, int]:
    """Engine image (or the pod label `by`) -> ready pods of one pool: which versions serve right now."""
    out: dict[str, int] = {}
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        if labels.get(L.ROLE) != role:
            continue
        conditions = pod.get("status", {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            continue
        containers = pod.get("spec", {}).get("containers") or [{}]
        image = str(labels.get(by, "?") if by else containers[0].get("image", "?"))
        out[image] = out.get(image, 0) + 1
    return dict(sorted(out.items()))
