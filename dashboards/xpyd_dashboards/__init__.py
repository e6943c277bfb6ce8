"""Grafana dashboards for xpyd, generated from code so every panel's PromQL is testable."""

from __future__ import annotations

from xpyd_dashboards.panels import DASHBOARDS, DashboardSpec, PanelSpec, Query
from xpyd_dashboards.queries import PanelQuery, all_queries, substitute

__all__ = ["DASHBOARDS", "DashboardSpec", "PanelQuery", "PanelSpec", "Query", "all_queries", "substitute"]
