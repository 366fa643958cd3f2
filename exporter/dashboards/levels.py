"""Threshold steps for the dashboards, read from the alerting threshold table.

A gauge that turns red must mean an alert fires (the node-mixin's 80/90
gauge against 85/97 alerts is what we avoid), so no dashboard types a level:
each one comes from a row of ``rules/thresholds.yaml``, loaded by
:func:`exporter.thresholds.load_thresholds`.
Rows are found by the metric they compare (``gpu_temperature``...), not by
alert name, so renaming an alert does not unhook a dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError
from exporter.thresholds import AlertRow, Thresholds, load_thresholds

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


@dataclass(frozen=True, slots=True)
class DashboardLevels:
    """Every level a dashboard shows, each from one row of the threshold table.

    A field is named by the metric its row compares (:data:`exporter.thresholds.METRICS`'s
    key), the one name of the concept from the table through the alert to the panel.
    """

    source: str  # the table's file name, for the dashboards' descriptions
    gpu_temperature: Steps  # celsius
    gpu_memory_used: Steps  # ratio of memory used
    job_utilization: Steps  # ratio; red when a held GPU is barely used
    gpu_power: tuple[tuple[str, Steps], ...]  # (GPU model, watts), catalogue order
    gpu_nvlink_utilization: Steps | None  # ratio
    pool_fragmentation_index: Steps  # 0-100: the compaction threshold
    gpu_up: Steps  # count of lost GPUs: any is the GPU-lost alert's severity
    source_up: Steps  # count of stale GPUs: any is the source-down alert's first severity
    alert_names: tuple[str, ...]  # every alert the table generates, for the firing panel
    # counts of GPUs in a health condition (issue 16): any is that alert's severity; None
    # where the table has no row for it (the panel is then drawn without colour)
    gpu_xid_critical: Steps | None = None
    gpu_ecc_double_bit: Steps | None = None
    gpu_remapped_rows_failure: Steps | None = None
    gpu_remapped_rows_pending: Steps | None = None
    gpu_clock_slowdown: Steps | None = None
    # the node pressure score (issue 20): NodePressureHigh's level; None without the row
    node_pressure_score: Steps | None = None
    gpu_nvlink_link_errors: Steps | None = None
    # jobs with a straggler (issue 31): GpuJobStraggler's severity; None without the row
    job_straggler_gpus: Steps | None = None


def _row(table: Thresholds, metric: str) -> AlertRow | None:
    for row in table.alerts:
        if row.metric.key == metric:
            return row
    return None


def _required(table: Thresholds, metric: str) -> AlertRow:
    row = _row(table, metric)
    if row is None:
        raise ConfigError(f"{table.source}: no alert row compares {metric}; the dashboards "
                          "draw its levels, so the table needs one")
    return row


def _row_steps(row: AlertRow, model: str | None = None) -> Steps:
    levels = {}
    for severity in row.severities:
        value = row.threshold(severity, model)
        if value is not None:
            levels[severity] = value
    return steps_for(row.op, levels)


def _any_is(severity: str) -> Steps:
    """Steps for a count of things in a bad state (lost GPUs): one is already the alert."""
    return Steps(OK, ((1.0, _COLOUR[severity]),))


def levels_from_table(table: Thresholds) -> DashboardLevels:
    """The dashboards' levels from a loaded threshold table."""
    power = _required(table, "gpu_power")
    return DashboardLevels(
        source=table.source,
        gpu_temperature=_row_steps(_required(table, "gpu_temperature")),
        gpu_memory_used=_row_steps(_required(table, "gpu_memory_used")),
        job_utilization=_row_steps(_required(table, "job_utilization")),
        gpu_power=tuple((entry.model, _row_steps(power, entry.model)) for entry in power.models),
        gpu_nvlink_utilization=_optional_steps(table, "gpu_nvlink_utilization"),
        pool_fragmentation_index=_row_steps(_required(table, "pool_fragmentation_index")),
        gpu_up=_any_is(_required(table, "gpu_up").severities[-1]),
        source_up=_any_is(_required(table, "source_up").severities[0]),
        alert_names=tuple(row.alert for row in table.alerts),
        gpu_xid_critical=_any_of(table, "gpu_xid_critical"),
        gpu_ecc_double_bit=_any_of(table, "gpu_ecc_double_bit"),
        gpu_remapped_rows_failure=_any_of(table, "gpu_remapped_rows_failure"),
        gpu_remapped_rows_pending=_any_of(table, "gpu_remapped_rows_pending"),
        gpu_clock_slowdown=_any_of(table, "gpu_clock_slowdown"),
        gpu_nvlink_link_errors=_any_of(table, "gpu_nvlink_link_errors"),
        node_pressure_score=_optional_steps(table, "node_pressure_score"),
        job_straggler_gpus=_any_of(table, "job_straggler_gpus"),
    )


def _optional_steps(table: Thresholds, metric: str) -> Steps | None:
    row = _row(table, metric)
    return _row_steps(row) if row is not None else None


def _any_of(table: Thresholds, metric: str) -> Steps | None:
    """A count of GPUs in the condition ``metric``'s row alerts on: one is its top severity."""
    row = _row(table, metric)
    return _any_is(row.severities[-1]) if row is not None else None


def load_levels(path: str | Path | None = None) -> DashboardLevels:
    """The dashboards' levels of the table at ``path`` (no path: the packaged one)."""
    return levels_from_table(load_thresholds(path))
