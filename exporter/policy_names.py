"""The placement policies' names: the one list the engine and the config both read.

A leaf: the sim source validates ``sources.sim.policy`` against these names, and
importing :mod:`exporter.placement` for them would pull numpy and the analysis
into the config loader (sources may not import placement at all).
:mod:`exporter.placement.engine` dispatches each name to its scorer in
:mod:`exporter.placement.policies`.
"""

from __future__ import annotations

POLICIES = ("fgd", "bestfit", "packing", "dotprod", "random", "tiered", "lookahead")

__all__ = ["POLICIES"]
