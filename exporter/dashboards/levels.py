"""Threshold steps for the dashboards, read from the alerting threshold table.

A gauge that turns red must mean an alert fires (the node-mixin's 80/90
gauge against 85/97 alerts is what we avoid), so no dashboard types a level:
each one comes from a row of ``rules/thresholds.yaml``, loaded by the
alerting package's :func:`~exporter.alerting.thresholds.load_thresholds`.
Rows are found by the metric they compare (``gpu_temperature``...), not by
alert name, so renaming an alert does not unhook a dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError

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
    """Every level a dashboard shows, each from one row of the threshold table."""

    source: str  # the table's file name, for the dashboards' descriptions
    temperature: Steps  # celsius
    memory: Steps  # ratio of memory used
    utilization_low: Steps  # ratio; red when a held GPU is barely used
    power: tuple[tuple[str, Steps], ...]  # (GPU model, watts), catalogue order
    nvlink_low: Steps | None  # ratio
    fragmentation: Steps  # pool fragmentation index 0-100: the compaction threshold
    lost: Steps  # count of lost GPUs: any is the GPU-lost alert's severity
    stale: Steps  # count of stale GPUs: any is the source-down alert's first severity
    alert_names: tuple[str, ...]  # every alert the table generates, for the firing panel
    # counts of GPUs in a health condition (issue 16): any is that alert's severity; None
    # where the table has no row for it (the panel is then drawn without colour)
    xid: Steps | None = None
    ecc_uncorrectable: Steps | None = None
    remap_failed: Steps | None = None
    remap_pending: Steps | None = None
    throttled: Steps | None = None
    # the node pressure score (issue 20): NodePressureHigh's level; None without the row
    node_pressure: Steps | None = None
    nvlink_errors: Steps | None = None


def _row(table: Any, metric: str) -> Any:
    for row in table.alerts:
        if row.metric.key == metric:
            return row
    return None


def _required(table: Any, metric: str) -> Any:
    row = _row(table, metric)
    if row is None:
        raise ConfigError(f"{table.source}: no alert row compares {metric}; the dashboards "
                          "draw its levels, so the table needs one")
    return row


def _row_steps(row: Any, model: str | None = None) -> Steps:
    levels = {}
    for severity in row.severities:
        value = row.threshold(severity, model)
        if value is not None:
            levels[severity] = value
    return steps_for(row.op, levels)


def _any_is(severity: str) -> Steps:
    """Steps for a count of things in a bad state (lost GPUs): one is already the alert."""
    return Steps(OK, ((1.0, _COLOUR[severity]),))


def levels_from_table(table: Any) -> DashboardLevels:
    """The dashboards' levels from a loaded threshold table
    (:class:`exporter.alerting.thresholds.Thresholds`)."""
    power = _required(table, "gpu_power")
    nvlink = _row(table, "gpu_nvlink_utilization")
    lost = _required(table, "gpu_up")
    source = _required(table, "source_up")
    return DashboardLevels(
        source=table.source,
        temperature=_row_steps(_required(table, "gpu_temperature")),
        memory=_row_steps(_required(table, "gpu_memory_used")),
        utilization_low=_row_steps(_required(table, "job_utilization")),
        power=tuple((entry.model, _row_steps(power, entry.model)) for entry in power.models),
        nvlink_low=_row_steps(nvlink) if nvlink is not None else None,
        fragmentation=_row_steps(_required(table, "pool_fragmentation_index")),
        lost=_any_is(lost.severities[-1]),
        stale=_any_is(source.severities[0]),
        alert_names=tuple(row.alert for row in table.alerts),
        xid=_any_of(table, "gpu_xid_critical"),
        ecc_uncorrectable=_any_of(table, "gpu_ecc_double_bit"),
        remap_failed=_any_of(table, "gpu_remapped_rows_failure"),
        remap_pending=_any_of(table, "gpu_remapped_rows_pending"),
        throttled=_any_of(table, "gpu_clock_slowdown"),
        nvlink_errors=_any_of(table, "gpu_nvlink_link_errors"),
        node_pressure=_optional_steps(table, "node_pressure_score"),
    )


def _optional_steps(table: Any, metric: str) -> Steps | None:
    row = _row(table, metric)
    return _row_steps(row) if row is not None else None


def _any_of(table: Any, metric: str) -> Steps | None:
    """A count of GPUs in the condition ``metric``'s row alerts on: one is its top severity."""
    row = _row(table, metric)
    return _any_is(row.severities[-1]) if row is not None else None


def load_levels(path: str | Path) -> DashboardLevels:
    """Read ``rules/thresholds.yaml`` (or another table) into the dashboards' levels."""
    from exporter.thresholds import load_thresholds

    return levels_from_table(load_thresholds(path))
