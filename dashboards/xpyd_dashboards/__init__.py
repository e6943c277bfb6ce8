"""Grafana dashboards for xpyd, generated from code so every panel's PromQL is testable."""

from __future__ import annotations

from xpyd_dashboards.panels import DASHBOARDS, FEATURES, DashboardSpec, PanelSpec, Query
from xpyd_dashboards.queries import PanelQuery, all_queries, applicable, substitute

__all__ = [
    "DASHBOARDS",
    "FEATURES",
    "DashboardSpec",
    "PanelQuery",
    "PanelSpec",
    "Query",
    "all_queries",
    "applicable",
    "substitute",
]
