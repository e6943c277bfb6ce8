"""Every panel's PromQL as (dashboard, title, expr), and variable substitution to run them for real."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from xpyd_dashboards import metrics as m
from xpyd_dashboards.panels import DASHBOARDS, FEATURES, DashboardSpec

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL target, named by its dashboard, panel title and legend."""

    dashboard: str
    title: str
    legend: str
    expr: str
    needs: str = ""  # a feature of panels.FEATURES the series exist with only; "" for every deployment


def all_queries(dashboards: tuple[DashboardSpec, ...] = DASHBOARDS) -> list[PanelQuery]:
    """Every query of every panel, in display order."""
    return [
        PanelQuery(spec.name, panel.title, query.legend, query.expr, query.needs)
        for spec in dashboards
        for panel in spec.panels()
        for query in panel.queries
    ]


def applicable(queries: list[PanelQuery], features: Collection[str] = ()) -> list[PanelQuery]:
    """The queries that must have data for a deployment with these features (panels.FEATURES)."""
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {FEATURES}")
    return [q for q in queries if not q.needs or q.needs in features]


def substitute(expr: str, *, namespace: str, deployment: str, rate_interval: str = "1m") -> str:
    """Replace Grafana's template variables with concrete values, as Grafana would before querying.

    Regex group references such as `$1` (used by label_replace) are left alone; any other
    unknown variable is an error, so a typo cannot silently produce an empty query.
    """
    values = {
        m.VAR_NAMESPACE: namespace,
        m.VAR_DEPLOYMENT: deployment,
        "__rate_interval": rate_interval,
    }

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name.isdigit():
            return match.group(0)
        if name not in values:
            raise ValueError(f"unknown Grafana variable ${name} in query: {expr}")
        return values[name]

    return _VARIABLE.sub(replace, expr)
