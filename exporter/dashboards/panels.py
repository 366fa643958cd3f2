"""What the three dashboards share: the datasource reference, template
variables, panel constructors, threshold steps and the grid layout.

grafanalib 0.7.1 writes the modern panels' JSON only in part (BarGauge and
GaugePanel still emit Grafana 6 ``fieldOptions``; ``Threshold`` writes the
base step's value as the string ``"null"``), so every constructor here puts
units, thresholds and reduce options where Grafana 10 reads them, through
grafanalib's ``extraJson``. Panels are then placed by :class:`Layout`, which
gives them their ``gridPos`` and an id in reading order: the same code gives
the same ids and the same bytes, which is what the drift test relies on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grafanalib import core
from grafanalib._gen import DashboardEncoder

from exporter import metrics as m
from exporter.dashboards.levels import OK, Steps

# Every panel and query names the datasource through the `datasource` variable,
# as a {type, uid} object (Grafana 8.3+); a plain name string is the legacy form.
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}

GRID_COLUMNS = 24
SCHEMA_VERSION = 39  # Grafana 10.4/11: no migration touches the panels on load
PLUGIN_VERSION = "10.4.0"


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False) -> core.Target:
    """One PromQL query. Tables ask for one instant value per series, in table format."""
    return core.Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format=core.TABLE_TARGET_FORMAT if instant else core.TIME_SERIES_TARGET_FORMAT,
        intervalFactor=1,
        datasource=DATASOURCE,
    )


def targets(*queries: tuple[str, str], instant: bool = False) -> list[core.Target]:
    """Several queries, lettered A, B, C... in order."""
    return [target(expr, legend, ref=chr(ord("A") + i), instant=instant)
            for i, (expr, legend) in enumerate(queries)]


# -- template variables ------------------------------------------------------


def datasource_variable() -> core.Template:
    return core.Template(
        name="datasource", label="Data source", query="prometheus", type="datasource",
        regex="", default=None,
    )


def pool_and_model_variables() -> list[core.Template]:
    """Data source, cluster, then pool, then the models of the chosen pools: every dashboard
    starts so. The clusters are read from ``gpufleet_build_info``, which every gpufleet
    process serves in either mode; with no ``cluster`` set anywhere the variable has only
    "All" (``.*``, which also matches a missing label)."""
    return [
        datasource_variable(),
        query_variable("cluster", "Cluster", f"label_values({m.BUILD_INFO.name}, cluster)"),
        query_variable("pool", "Pool", f'label_values({m.GPU_INFO.name}{{cluster=~"$cluster"}}, pool)'),
        query_variable("model", "Model",
                       f'label_values({m.GPU_INFO.name}{{cluster=~"$cluster",pool=~"$pool"}}, model)'),
    ]


def query_variable(name: str, label: str, query: str, *, multi: bool = True,
                   include_all: bool = True) -> core.Template:
    """A variable filled by ``label_values(...)``; refreshed when the time range changes,
    because pools, nodes and GPUs come and go. "All" is the regex ``.*`` rather than
    every value spelled out: shorter queries, and a new pool shows before a refresh."""
    variable = core.Template(
        name=name, label=label, query=query, dataSource=DATASOURCE, multi=multi,
        includeAll=include_all, allValue=".*" if include_all else None,
        refresh=core.REFRESH_ON_TIME_RANGE_CHANGE, regex="",
        sort=core.SORT_ALPHA_ASC if name != "gpu" else core.SORT_NUMERIC_ASC,
    )
    if include_all:
        # open on "All"; grafanalib's `default` can only set one string for text and value
        variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


# -- panels ---------------------------------------------------------------------


def _thresholds(steps: Steps | None) -> dict[str, Any]:
    if steps is None:  # no level applies: one neutral colour, nothing drawn
        return {"mode": "absolute", "steps": [{"color": OK, "value": None}]}
    return steps.to_json()


def _defaults(unit: str, steps: Steps | None, minimum: float | None,
              maximum: float | None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "thresholds": _thresholds(steps)}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return defaults


def _extra(field_defaults: dict[str, Any], **more: Any) -> dict[str, Any]:
    """extraJson of every panel. ``pluginVersion`` tells Grafana the options are already
    in today's shape: without it Grafana assumes 6.1 and runs the panel's old-format
    migrations on load."""
    return {"pluginVersion": PLUGIN_VERSION, "fieldConfig": {"defaults": field_defaults}, **more}


class _BarGauge(core.BarGauge):
    """grafanalib's BarGauge without its Grafana 6 ``options.fieldOptions``, which a
    Grafana migration would otherwise copy over the field config (thresholds included)."""

    def to_json_data(self) -> dict[str, Any]:
        data = super().to_json_data()
        data["options"].pop("fieldOptions", None)
        return data


class _GaugePanel(core.GaugePanel):
    """grafanalib's GaugePanel without the reduce and display keys it writes into the
    field config, where Grafana 10 does not read them (they live in ``options``)."""

    def to_json_data(self) -> dict[str, Any]:
        data = super().to_json_data()
        defaults = data["fieldConfig"]["defaults"]
        for key in ("calcs", "limit", "values", "override", "title", "links"):
            defaults.pop(key, None)
        for key in ("showThresholdLabels", "showThresholdMarkers"):
            data["fieldConfig"].pop(key, None)
        return data


def timeseries(title: str, queries: list[core.Target], unit: str, *, description: str = "",
               steps: Steps | None = None, stack: bool = False, minimum: float | None = None,
               maximum: float | None = None, step_after: bool = False, fill: int = 10,
               overrides: Sequence[dict[str, Any]] = ()) -> core.TimeSeries:
    """A time series; with ``steps`` the warning and critical levels are drawn as lines."""
    extra = _extra(_defaults(unit, steps, minimum, maximum))
    return core.TimeSeries(
        title=title, description=description, dataSource=DATASOURCE, targets=queries, unit=unit,
        thresholdsStyleMode="line" if steps is not None else "off",
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
        fillOpacity=fill, lineInterpolation="stepAfter" if step_after else "linear",
        tooltipMode="multi", tooltipSort="desc", legendDisplayMode="table",
        legendPlacement="right", legendCalcs=["lastNotNull", "max"], showPoints="never",
        overrides=list(overrides), maxDataPoints=None, extraJson=extra,
    )


def stat(title: str, queries: list[core.Target], unit: str, *, description: str = "",
         steps: Steps | None = None, color_mode: str = "value", graph: bool = True,
         text_mode: str = "auto", continuous: str | None = None, minimum: float | None = None,
         maximum: float | None = None, no_value: str = "0") -> core.Stat:
    """One number per series. ``continuous`` colours by a Grafana scheme instead of steps,
    for counts that have no alert level (a node heat map)."""
    defaults = _defaults(unit, steps, minimum, maximum)
    defaults["color"] = {"mode": continuous} if continuous else {"mode": "thresholds"}
    return core.Stat(
        title=title, description=description, dataSource=DATASOURCE, targets=queries,
        format=unit, reduceCalc="lastNotNull", colorMode=color_mode,
        graphMode="area" if graph else "none", textMode=text_mode, noValue=no_value,
        maxDataPoints=None,
        extraJson=_extra(defaults),
    )


def gauge(title: str, queries: list[core.Target], unit: str, *, steps: Steps | None,
          description: str = "", minimum: float = 0, maximum: float | None = None) -> core.GaugePanel:
    return _GaugePanel(
        title=title, description=description, dataSource=DATASOURCE, targets=queries, format=unit,
        calc="lastNotNull", min=minimum, max=maximum, maxDataPoints=None,
        extraJson=_extra(
            _defaults(unit, steps, minimum, maximum),
            options={
                "orientation": "auto", "showThresholdLabels": False, "showThresholdMarkers": True,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
        ),
    )


def bar_gauge(title: str, queries: list[core.Target], unit: str, *, description: str = "",
              steps: Steps | None = None, minimum: float = 0, maximum: float | None = None,
              overrides: Sequence[dict[str, Any]] = (),
              continuous: str | None = None) -> core.BarGauge:
    defaults = _defaults(unit, steps, minimum, maximum)
    defaults["color"] = {"mode": continuous} if continuous else {"mode": "thresholds"}
    extra = _extra(defaults, options={
        "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
        "valueMode": "color", "namePlacement": "left",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    })
    extra["fieldConfig"]["overrides"] = list(overrides)
    return _BarGauge(
        title=title, description=description, dataSource=DATASOURCE, targets=queries, format=unit,
        calc="lastNotNull", min=minimum, max=maximum, displayMode=core.GAUGE_DISPLAY_MODE_GRADIENT,
        orientation=core.ORIENTATION_HORIZONTAL, maxDataPoints=None, extraJson=extra,
    )


def table(title: str, queries: list[core.Target], unit: str, *, description: str = "",
          steps: Steps | None = None, hide: Iterable[str] = (), rename: dict[str, str] | None = None,
          order: Sequence[str] = (), sort_by: str | None = None, descending: bool = True,
          color_column: str | None = None,
          mappings: Sequence[dict[str, Any]] = ()) -> core.Table:
    """Instant values as rows. Queries with several targets are merged on their labels;
    ``hide`` drops label columns nobody reads (uuid, the scrape's instance).
    ``color_column`` colours that column's cells by ``steps``."""
    hidden = {"Time": True, "__name__": True, "instance": True, **{name: True for name in hide}}
    renames = rename or {}
    transformations: list[dict[str, Any]] = []
    if len(queries) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({
        "id": "organize",
        "options": {
            "excludeByName": dict(sorted(hidden.items())),
            "indexByName": {name: i for i, name in enumerate(order)},
            "renameByName": dict(sorted(renames.items())),
        },
    })
    overrides = []
    if color_column is not None:
        overrides.append({
            "matcher": {"id": "byName", "options": renames.get(color_column, color_column)},
            "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background"}}],
        })
    sort = [core.TableSortByField(displayName=renames.get(sort_by, sort_by), desc=descending)]\
        if sort_by else []
    return core.Table(
        title=title, description=description, dataSource=DATASOURCE, targets=queries, unit=unit,
        transformations=transformations, overrides=overrides, sortBy=sort, filterable=True,
        maxDataPoints=None, extraJson=_extra({**_defaults(unit, steps, None, None),
                                              "mappings": list(mappings)}),
    )


def by_name_thresholds(name: str, steps: Steps, regex: bool = False) -> dict[str, Any]:
    """A field override: series named ``name`` (or matching it) colour by their own levels,
    and a bar's full length is the highest of them (for power, the cap)."""
    return {
        "matcher": {"id": "byRegexp" if regex else "byName", "options": name},
        "properties": [{"id": "thresholds", "value": steps.to_json()},
                       {"id": "max", "value": max(steps.values())}],
    }


# -- layout -------------------------------------------------------------------


@dataclass
class _Placed:
    panel: core.Panel
    row: core.RowPanel | None


class Layout:
    """Places panels left to right on the 24-column grid, wrapping to a new line.

    ``row()`` starts a full-width row header; panels below belong to it. Ids
    are given in reading order, so they are stable as long as the order is.
    """

    def __init__(self) -> None:
        self._placed: list[_Placed] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        self._newline()
        panel = core.RowPanel(title=title, gridPos=core.GridPos(h=1, w=GRID_COLUMNS, x=0, y=self._y))
        self._placed.append(_Placed(panel, None))
        self._y += 1

    def add(self, panel: core.Panel, w: int, h: int) -> None:
        if not 0 < w <= GRID_COLUMNS:
            raise ValueError(f"panel {panel.title!r}: width {w} is not within 1..{GRID_COLUMNS}")
        if self._x + w > GRID_COLUMNS:
            self._newline()
        panel.gridPos = core.GridPos(h=h, w=w, x=self._x, y=self._y)
        self._placed.append(_Placed(panel, None))
        self._x += w
        self._line_height = max(self._line_height, h)

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def panels(self) -> list[core.Panel]:
        out = []
        for number, placed in enumerate(self._placed, start=1):
            placed.panel.id = number
            out.append(placed.panel)
        return out


def dashboard(*, uid: str, title: str, description: str, tags: Sequence[str],
              variables: Sequence[core.Template], layout: Layout,
              links: Sequence[dict[str, Any]] = ()) -> core.Dashboard:
    return core.Dashboard(
        uid=uid, title=title, description=description, tags=list(tags),
        templating=core.Templating(list=list(variables)), panels=layout.panels(),
        time=core.Time("now-6h", "now"), refresh="30s", timezone="browser",
        graphTooltip=core.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, schemaVersion=SCHEMA_VERSION,
        editable=False, links=list(links),
    )


def dashboard_link(title: str, uid: str) -> dict[str, Any]:
    """A link to another gpufleet dashboard that keeps the time range and the variables."""
    return {
        "title": title, "type": "link", "url": f"/d/{uid}", "icon": "dashboard",
        "includeVars": True, "keepTime": True, "asDropdown": False, "tags": [],
        "targetBlank": False, "tooltip": "",
    }


def to_json(board: core.Dashboard) -> str:
    """The dashboard's JSON text: sorted keys, two-space indent, newline at the end."""
    data = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
