"""The threshold table, ``rules/thresholds.yaml``, as one typed object.

:func:`load_thresholds` is the one loader (no path: the packaged table, read once per
process); it returns :class:`Thresholds`, whose rows and sections are frozen
dataclasses. Everything that reads a threshold, a ``for`` or a scaling knob reads that
object: the alerting and recording rules, the dashboards, the advisor, the config's
defaults, the live scaling hint and ``gpufleet load``.

A leaf package: it imports neither :mod:`exporter.alerting` nor :mod:`exporter.pool_load`,
so both can read the table without a package-level import cycle.
"""

from exporter.thresholds.scaling import ScalingSettings, ScalingTable
from exporter.thresholds.sections import RESOURCES, LoadStatistics, Pressure
from exporter.thresholds.table import (
    CHECKOUT_TABLE,
    DEPLOYMENTS,
    METRICS,
    SEVERITIES,
    AlertRow,
    Level,
    ModelThreshold,
    TableMetric,
    ThresholdError,
    Thresholds,
    command_table,
    load_thresholds,
    parse_thresholds,
)

__all__ = [
    "CHECKOUT_TABLE",
    "DEPLOYMENTS",
    "METRICS",
    "RESOURCES",
    "SEVERITIES",
    "AlertRow",
    "Level",
    "LoadStatistics",
    "ModelThreshold",
    "Pressure",
    "ScalingSettings",
    "ScalingTable",
    "TableMetric",
    "ThresholdError",
    "Thresholds",
    "command_table",
    "load_thresholds",
    "parse_thresholds",
]
