"""Engine revisions, and which revisions each pool serves.

A prefill worker hands its KV cache to a decode worker, so the two ends must run engines that
agree on what crosses the handoff. The router only pairs workers of the same engine revision
(the pod label `xpyd.io/engine-rev`). An engine change moves both pools together, StatefulSets and
LeaderWorkerSets alike (xpyd_operator.lockstep), so each revision keeps a pair at every step; there is
no decode-first order left: it kept, between the last old decode replica going and prefill rolling, no
pair on either revision. Pure functions of the manifests and pods; the reconciler and status call them.
"""

from __future__ import annotations

from typing import Any

from xpyd_api import handoff
from xpyd_api import labels as L


def engine_rev(image: str, connector: str | None, facts: handoff.HandoffFacts | None = None) -> str:
    """A short label-safe revision of what must match across a KV handoff: the engine image and connector,
    and with `facts` (xpyd_api.handoff.pool_facts) the release, model, block size, KV dtype and layout,
    tensor and pipeline parallel, attention backend and GPU; not what leaves the handoff alone (--max-num-seqs)."""
    return handoff.revision(image, connector, facts)


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
