"""Render a DashboardSpec into Grafana dashboard JSON with grafana-foundation-sdk's typed builders."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as gcm
from grafana_foundation_sdk.models import dashboard as gm

from xpyd_dashboards import metrics as m
from xpyd_dashboards.panels import DashboardSpec, PanelSpec

_DATASOURCE = gm.DataSourceRef(type_val="prometheus", uid=f"${{{m.VAR_DATASOURCE}}}")
_PANEL_HEIGHT = 8
_GRID_WIDTH = 24


def _variables() -> list[gd.DatasourceVariable | gd.QueryVariable]:
    datasource = gd.DatasourceVariable(m.VAR_DATASOURCE).label("Data source").type("prometheus")
    namespace = (
        gd.QueryVariable(m.VAR_NAMESPACE)
        .label("Namespace")
        .datasource(_DATASOURCE)
        .query(f"label_values({m.ROUTER_INFLIGHT}, namespace)")
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(gm.VariableSort.ALPHABETICAL_ASC)
    )
    deployment = (
        gd.QueryVariable(m.VAR_DEPLOYMENT)
        .label("Deployment")
        .datasource(_DATASOURCE)
        .query(f'label_values({m.ROUTER_INFLIGHT}{{namespace="$namespace"}}, deployment)')
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(gm.VariableSort.ALPHABETICAL_ASC)
    )
    return [datasource, namespace, deployment]


def _panel(spec: PanelSpec, panel_id: int, x: int, y: int) -> timeseries.Panel:
    legend = gc.VizLegendOptions().display_mode(gcm.LegendDisplayMode.LIST).placement(gcm.LegendPlacement.BOTTOM)
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(_DATASOURCE)
        .grid_pos(gm.GridPos(h=_PANEL_HEIGHT, w=spec.width, x=x, y=y))
        .legend(legend.show_legend(True))
        .tooltip(gc.VizTooltipOptions().mode(gcm.TooltipDisplayMode.MULTI))
    )
    for index, query in enumerate(spec.queries):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + index))
            .datasource(_DATASOURCE)
        )
        panel = panel.with_target(target)
    return panel


def render(spec: DashboardSpec) -> str:
    """The dashboard as stable, pretty-printed JSON (sorted keys, trailing newline)."""
    builder = (
        gd.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["xpyd"])
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
    )
    for variable in _variables():
        builder = builder.with_variable(variable)
    y = 0
    panel_id = 0
    for row in spec.rows:
        panel_id += 1
        grid = gm.GridPos(h=1, w=_GRID_WIDTH, x=0, y=y)
        builder = builder.with_row(gd.Row(row.title).id(panel_id).grid_pos(grid))
        y += 1
        x = 0
        for panel in row.panels:
            if x + panel.width > _GRID_WIDTH:
                x, y = 0, y + _PANEL_HEIGHT
            panel_id += 1
            builder = builder.with_panel(_panel(panel, panel_id, x, y))
            x += panel.width
        y += _PANEL_HEIGHT
    raw = JSONEncoder(sort_keys=True).encode(builder.build())
    return json.dumps(json.loads(raw), indent=2, sort_keys=True) + "\n"
