"""Reading a Prometheus text page (an engine's or the router's /metrics) in tests, e2e and benches."""

from __future__ import annotations

import re


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` on the page whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for m in re.finditer(r"^" + re.escape(name) + r"(\{(?P<l>[^}]*)\})?\s+(?P<v>\S+)", text, re.M):
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("l") or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group("v"))
    return total
