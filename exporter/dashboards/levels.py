"""Threshold steps for the dashboards, read from the alerting threshold table.

A gauge that turns red must mean an alert fires (the node-mixin's 80/90
gauge against 85/97 alerts is what we avoid), so no dashboard types a level:
each one comes from a row of ``rules/thresholds.yaml``, loaded by
:func:`exporter.thresholds.load_thresholds`. Nor does a panel coloured at a row's
levels write its own PromQL: it plots what that row's alert compares
(:meth:`DashboardLevels.query`), from the metric's one record.
Rows are found by the metric they compare (``gpu_temperature``...), not by
alert name, so renaming an alert does not unhook a dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError
from exporter.thresholds import METRICS, AlertRow, Thresholds, load_thresholds

OK, WARNING, CRITICAL = "green", "orange", "red"
_COLOUR = {"warning": WARNING, "critical": CRITICAL}


@dataclass(frozen=True, slots=True)
class Steps:
    """Grafana threshold steps: ``base`` below the first value, then (value, colour) rising."""

    base: str
    levels: tuple[tuple[float, str], ...]

    def to_json(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": self.base, "value": None}]
        steps += [{"color": colour, "value": value} for value, colour in self.levels]
        return {"mode": "absolute", "steps": steps}

    def values(self) -> tuple[float, ...]:
        return tuple(value for value, _ in self.levels)


def steps_for(op: str, levels: dict[str, float]) -> Steps:
    """Steps for a condition ``value <op> level``: above-conditions go green, orange, red
    as the value rises; below-conditions (utilization low) go red, orange, green."""
    if op in (">", ">="):
        rising = sorted((value, _COLOUR[severity]) for severity, value in levels.items())
        return Steps(OK, tuple(rising))
    if op == "<":
        # below the lowest level the worst severity applies; each level reached is one better
        ordered = sorted(levels.items(), key=lambda item: item[1])
        worst = _COLOUR[ordered[0][0]]
        better = [_COLOUR[severity] for severity, _ in ordered[1:]] + [OK]
        return Steps(worst, tuple((value, colour) for (_, value), colour in
                                  zip(ordered, better, strict=True)))
    raise ValueError(f"no threshold steps for the condition {op!r}")


# the rows every dashboard draws: a table without one of them cannot give the dashboards
REQUIRED = ("gpu_temperature", "gpu_memory_used", "job_utilization", "gpu_power",
            "pool_fragmentation_index", "gpu_up", "source_up")


@dataclass(frozen=True, slots=True)
class DashboardLevels:
    """Every level a dashboard shows, each from one row of the threshold table, and what a
    panel coloured at those levels plots.

    A metric is named by its key (:data:`exporter.thresholds.METRICS`, the one record of the
    concept from the table through the alert to the panel). A panel that colours or draws a
    row's levels plots :meth:`query`, the value that row's alert compares with them, and may
    only pick series of it (``max``, ``min``, ``topk``, ``bottomk``): each value it shows is
    then one series' value, and its colour says whether the alert would fire on that series
    (tests/test_table_metric_record.py walks the dashboards for it).
    """

    table: Thresholds

    @property
    def source(self) -> str:
        """The table's file name, for the dashboards' descriptions."""
        return self.table.source

    @property
    def alert_names(self) -> tuple[str, ...]:
        """Every alert the table generates, for the firing panel."""
        return tuple(row.alert for row in self.table.alerts)

    def query(self, metric: str, selector: str) -> str:
        """What a panel coloured at ``metric``'s levels plots, over ``selector``'s series."""
        return self.table.panel_query(METRICS[metric], selector)

    def steps(self, metric: str) -> Steps | None:
        """The levels of the row comparing ``metric``; None where the table has none."""
        row = self.table.row(METRICS[metric].key)
        return _row_steps(row) if row is not None else None

    def power(self) -> tuple[tuple[str, Steps], ...]:
        """(GPU model, its power levels in watts), in catalogue order."""
        row = self.table.row("gpu_power")
        assert row is not None  # levels_from_table refused a table without it
        return tuple((entry.model, _row_steps(row, entry.model)) for entry in row.models)

    def any_of(self, metric: str, first: bool = False) -> Steps | None:
        """For a count of things in the condition ``metric``'s row alerts on (lost GPUs): one
        is already that row's top severity (its first with ``first``); None without a row."""
        row = self.table.row(METRICS[metric].key)
        if row is None:
            return None
        return Steps(OK, ((1.0, _COLOUR[row.severities[0 if first else -1]]),))


def _row_steps(row: AlertRow, model: str | None = None) -> Steps:
    levels = {}
    for severity in row.severities:
        value = row.threshold(severity, model)
        if value is not None:
            levels[severity] = value
    return steps_for(row.op, levels)


def levels_from_table(table: Thresholds) -> DashboardLevels:
    """The dashboards' levels from a loaded threshold table."""
    for metric in REQUIRED:
        if table.row(metric) is None:
            raise ConfigError(f"{table.source}: no alert row compares {metric}; the dashboards "
                              "draw its levels, so the table needs one")
    return DashboardLevels(table)


def load_levels(path: str | Path | None = None) -> DashboardLevels:
    """The dashboards' levels of the table at ``path`` (no path: the packaged one)."""
    return levels_from_table(load_thresholds(path))
