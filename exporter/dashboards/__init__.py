"""Grafana dashboards, generated with grafanalib: one module per dashboard.

``gpufleet dashboards`` writes them into ``dashboards/``; the committed JSON
must equal what :func:`render` gives, byte for byte (a test checks it).
Every level a panel colours or draws comes from the alerting threshold table
(:mod:`exporter.dashboards.levels`).
"""

from __future__ import annotations

from types import ModuleType

from exporter.dashboards import fleet, fragmentation, node, panels
from exporter.dashboards.levels import DashboardLevels

# file name order is the order they are written and listed in
DASHBOARDS: tuple[ModuleType, ...] = (fleet, node, fragmentation)


def render(levels: DashboardLevels) -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {module.FILE: panels.to_json(module.build(levels)) for module in DASHBOARDS}


__all__ = ["DASHBOARDS", "render"]
