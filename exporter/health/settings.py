"""The health settings in force, and their bounds: a wrong value is one error naming its key.

The settings are the threshold table's ``health`` section (exporter/thresholds/health.py,
where :func:`check_settings` lives with them); this module keeps its old import path. They
are here, not with the advisor, because node mode runs the health monitor without the
advisor, and the advisor's modules load numpy (docs/performance.md, "A lean node").
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from exporter.health.monitor import HealthMonitor
from exporter.thresholds import load_thresholds
from exporter.thresholds.defaults import follows_table
from exporter.thresholds.health import HealthTable
from exporter.thresholds.health import check_settings as check_settings

if TYPE_CHECKING:
    from exporter.config import AdvisorConfig
    from exporter.thresholds import Thresholds


def health_settings(config: AdvisorConfig, table: Thresholds | None = None) -> HealthTable:
    """The health monitor's settings: the threshold table's ``health`` section (``table``,
    the one in force; without one, the installed table's), with ``advisor.health.clean_window``
    and ``advisor.health.min_drain`` where the config sets them (a default follows the table)."""
    health = (table.health if table is not None else None) or load_thresholds().health
    assert health is not None  # parse_thresholds always sets it
    verdicts, remediation = health.verdicts, health.remediation
    if not follows_table(config.health.clean_window):
        verdicts = dataclasses.replace(verdicts, clean_window_seconds=float(config.health.clean_window))
    if not follows_table(config.health.min_drain):
        remediation = dataclasses.replace(remediation, min_drain_seconds=float(config.health.min_drain))
    return HealthTable(verdicts, remediation, health.stragglers)


def build_health(config: AdvisorConfig, table: Thresholds | None = None) -> HealthMonitor:
    """The health monitor: the table's health section, less the config's overrides."""
    health = health_settings(config, table)
    return HealthMonitor(health.verdicts, health.remediation, health.stragglers)
