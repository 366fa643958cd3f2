"""The ``scaling:`` section of rules/thresholds.yaml: the 0.8/0.3 rule's knobs, per pool.

    scaling:
      up: 0.8            # scale up above this demand ratio
      down: 0.3          # scale down below it
      target: 0.8        # the ratio a new size aims at (default: up)
      min_nodes: 4       # the bounds of each pool named under pools (unless it sets its own);
      max_nodes: 32      # a pool not named there is not autoscaled: hints, but no bounds
      idle_utilization: 0.3  # a pool below this mean utilisation ...
      memory_pressure: 0.85  # ... and below this mean memory use is idle: no scale-up
      hysteresis: 2      # samples in a row out of the band before acting
      min_samples: 30    # no hint before the pool's window holds this many samples
      dwell: 5m          # a hint nobody followed is withdrawn after the pool stayed this
                         # long inside the band
      cooldown_up: 1h    # a scale-up waits this long after a scale-down
      cooldown_down: 3h  # a scale-down waits this long after a scale-up (a hint in the
                         # same direction as the last never waits)
      startup: 1h        # a node ordered now serves this much later (the predictive horizon)
      node_gpus: 8       # GPUs a node adds, where the fleet does not say
      mode: reactive     # or predictive: the rule reads the forecast peak until a node started
                         # now serves (the daily profile of the last 14 days plus the trend)
      pools:             # overrides per pool, any of the keys above but pools
        H800: {max_nodes: 876}

Validated with the rest of the table by the one validator's file checks
(:mod:`exporter.validate`; :func:`exporter.thresholds.table.parse_thresholds` hands the section
to :func:`parse_scaling`), so a wrong value is a ThresholdError naming the dotted key.
:class:`ScalingSettings` lives here, with the table, rather than in
:mod:`exporter.pool_load.scaling` which acts on it: the table package imports neither
``exporter.pool_load`` nor ``exporter.alerting``, so both can read it without a package-level
import cycle.

Bounds are per pool (issue 30): the reference profile's 4-32 nodes is the range of one
autoscaling group, so a pool gets ``min_nodes``/``max_nodes`` only when ``pools`` names it;
any other pool's hints are unbounded (0 to no maximum) rather than clamped to a range
meant for another pool.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter import validate
from exporter.errors import ConfigError, quoted

MAX_POOLS = 1024
MODES = ("reactive", "predictive")
_KEYS = ("up", "down", "target", "min_nodes", "max_nodes", "hysteresis", "cooldown_up",
         "cooldown_down", "startup", "node_gpus", "idle_utilization", "memory_pressure",
         "min_samples", "dwell")
_RATIOS = ("up", "down", "target", "idle_utilization", "memory_pressure")
_COUNTS = {"min_nodes": (0, 1_000_000), "max_nodes": (1, 1_000_000), "hysteresis": (1, 100),
           "node_gpus": (1, 1024), "min_samples": (1, 100_000)}
_DURATIONS = {"cooldown_up": "cooldown_up_s", "cooldown_down": "cooldown_down_s", "startup": "startup_s",
              "dwell": "dwell_s"}
MAX_DURATION_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class ScalingSettings:
    up: float = 0.8  # scale up above this demand ratio
    down: float = 0.3  # scale down below it
    target: float = 0.8  # the ratio a new size aims at: ceil(demand / (node_gpus * target))
    min_nodes: int = 4  # the bounds clamp only a size the rule chose, never the current size
    max_nodes: int | None = 32  # None: no upper bound (a pool the table does not name)
    node_gpus: int = 8  # GPUs one node adds
    hysteresis: int = 2  # samples in a row out of the band before acting
    # no hint before this many samples: half the analyzer's default window of 60 (2.5 min
    # at the 5 s collect interval); the first samples after a start are not the pool's load
    min_samples: int = 30
    # a hint nobody followed is withdrawn once the pool stayed this long inside the band
    # (the HPA's default scale-down stabilisation window): one in-band sample is not a trend
    dwell_s: float = 300.0
    cooldown_up_s: float = 3600.0  # a scale-up after a scale-down waits this long
    cooldown_down_s: float = 3 * 3600.0  # a scale-down after a scale-up waits this long
    startup_s: float = 3600.0  # a node added now serves only this much later
    # seed 001: GPUs all allocated yet idle are no reason to add nodes. A pool whose mean
    # utilisation is below idle_utilization, and whose mean memory use is below
    # memory_pressure (a memory-bound job runs at low SM utilisation), does not scale up.
    idle_utilization: float = 0.3  # the table's GpuJobUtilizationLow warning
    memory_pressure: float = 0.85  # the table's GpuMemoryHigh warning

    def __post_init__(self) -> None:
        if not 0 < self.down < self.up:
            raise ValueError(f"need 0 < down < up, got down {self.down} and up {self.up}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target}")
        if self.max_nodes is not None and not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"need 0 <= min_nodes <= max_nodes, got {self.min_nodes} and {self.max_nodes}")
        if self.node_gpus < 1 or self.hysteresis < 1 or self.min_samples < 1:
            raise ValueError("node_gpus, hysteresis and min_samples must be at least 1")
        if min(self.cooldown_up_s, self.cooldown_down_s, self.startup_s, self.dwell_s) < 0:
            raise ValueError("cooldowns, dwell and startup must not be negative")

    def nodes_for(self, demand_gpus: float) -> int:
        """Nodes that put ``demand_gpus`` at the target ratio, before the bounds."""
        # 1e-9: 0.8 * 10 GPUs is 8.000000000000002 in floats, which must not round up to a node
        return max(0, math.ceil(demand_gpus / (self.node_gpus * self.target) - 1e-9))

    def clamp(self, nodes: int) -> tuple[int, str]:
        """``nodes`` within the bounds, and the bound's name when it applied."""
        if self.max_nodes is not None and nodes > self.max_nodes:
            return self.max_nodes, "max_nodes"
        if nodes < self.min_nodes:
            return self.min_nodes, "min_nodes"
        return nodes, ""


@dataclass(frozen=True, slots=True)
class ScalingTable:
    default: ScalingSettings
    # (pool, its settings, whether the table set node_gpus for it)
    pools: tuple[tuple[str, ScalingSettings, bool], ...] = ()
    node_gpus_given: bool = False  # the table set node_gpus (else the fleet's node size is used)
    mode: str = "reactive"  # one of MODES

    def for_pool(self, pool: str, node_gpus: int | None = None) -> ScalingSettings:
        """The pool's settings; ``node_gpus`` (the fleet's node size) unless the table set one.

        A pool ``pools`` does not name gets the default rule without bounds: the bounds
        are one autoscaling group's range, not every pool's.
        """
        settings = dataclasses.replace(self.default, min_nodes=0, max_nodes=None)
        given = self.node_gpus_given
        for name, pool_settings, pool_given in self.pools:
            if name == pool:
                settings, given = pool_settings, pool_given
        if node_gpus is not None and node_gpus >= 1 and not given:
            return dataclasses.replace(settings, node_gpus=node_gpus)
        return settings


DEFAULT = ScalingTable(ScalingSettings())


def _values(raw: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in validate.mapping(raw, where, allowed).items():
        at = f"{where}.{key}"
        if key in _RATIOS:
            out[key] = validate.share(value, at)
        elif key in _COUNTS:
            out[key] = validate.whole(value, at, *_COUNTS[key])
        elif key in _DURATIONS:
            seconds = validate.duration(value, at)
            if seconds > MAX_DURATION_S:
                raise ConfigError(f"{at}: must be at most 7d, got {quoted(value)}")
            out[_DURATIONS[key]] = seconds
    return out


def _settings(base: ScalingSettings, values: dict[str, Any], where: str) -> ScalingSettings:
    if "up" in values and "target" not in values:
        values = {**values, "target": values["up"]}  # the target follows up unless given
    try:
        return dataclasses.replace(base, **values)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_scaling(raw: Any) -> ScalingTable:
    section = validate.mapping(raw, "scaling", (*_KEYS, "pools", "mode"))
    values = _values(section, "scaling", (*_KEYS, "pools", "mode"))
    mode = section.get("mode", "reactive")
    if mode not in MODES:
        raise ConfigError(f"scaling.mode: must be one of {', '.join(MODES)}, "
                          f"got {quoted(str(mode)[:40])}")
    pools_raw = section.get("pools")
    default = _settings(ScalingSettings(), values, "scaling")
    pools: list[tuple[str, ScalingSettings, bool]] = []
    if pools_raw is not None:
        if not isinstance(pools_raw, Mapping) or len(pools_raw) > MAX_POOLS:
            raise ConfigError(f"scaling.pools: must be a mapping of at most {MAX_POOLS} pools to "
                              "overrides")
        for pool, override in pools_raw.items():
            where = f"scaling.pools.{pool}"
            if not isinstance(pool, str) or not pool.strip():
                raise ConfigError(f"scaling.pools: pool names must be strings, got {quoted(pool)}")
            override_values = _values(override, where, _KEYS)
            pools.append((pool, _settings(default, override_values, where),
                          "node_gpus" in override_values or "node_gpus" in values))
    return ScalingTable(default, tuple(pools), "node_gpus" in values, mode)
