"""The table's ``load_statistics`` and ``pressure`` sections (issue 20), typed and validated.

Validated with the rest of the table (:func:`parse_sections`, called by
:func:`exporter.thresholds.table.parse_thresholds`); the recording rules generated from
them are :mod:`exporter.alerting.pool_load_rules`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter import validate
from exporter.errors import ConfigError, quoted

RESOURCES = ("cpu", "memory", "io")  # the score's terms, in the order
PRESSURE_METRICS = ("node_cpu_busy", "node_memory_used", "node_disk_io_busy",
                    "node_pressure_score")  # rows comparing these need the pressure section

_MAX_WINDOWS = 4  # each window is 6 statistics per pool; 4 covers 1h/6h/24h/7d
_MAX_WINDOW = 31 * 86400.0  # a month of 30 s evaluations is 89,280 samples per series
_MAX_RATE_WINDOW = 3600.0


@dataclass(frozen=True, slots=True)
class LoadStatistics:
    """``load_statistics:``: the windows (seconds, as written) and the quantile."""

    windows: tuple[float, ...]
    quantile: float  # 0 < q < 1, a whole percentage: it names the series (p95)


@dataclass(frozen=True, slots=True)
class Pressure:
    """``pressure:``: the score's rate window, and each resource's weight and cap."""

    rate_window: float  # seconds; rate() of the CPU and disk counters
    weights: tuple[tuple[str, float], ...]  # (resource, weight) in RESOURCES order; sum 1
    caps: tuple[tuple[str, float], ...]  # (resource, cap) in RESOURCES order; 0 < cap <= 1

    def weight(self, resource: str) -> float:
        return dict(self.weights)[resource]

    def cap(self, resource: str) -> float:
        return dict(self.caps)[resource]

    def score(self, cpu: float, memory: float, io: float) -> float:
        """The score of one node, exactly as the recording rule adds it up (same order)."""
        values = {"cpu": cpu, "memory": memory, "io": io}
        total = 0.0
        for resource in RESOURCES:
            total += self.weight(resource) * min(values[resource] / self.cap(resource), 1.0)
        return total


def parse_sections(top: Mapping[str, Any], rows: tuple[tuple[str, str], ...]
                   ) -> tuple[LoadStatistics | None, Pressure | None]:
    """Both sections, each ``None`` when the table has none (no rules are generated then);
    ``rows`` are the alert rows' (alert name, metric key).

    A row comparing a pressure series needs the ``pressure`` section: without it nothing
    records the series, and the alert would never fire.
    """
    statistics = (_load_statistics(top["load_statistics"])
                  if "load_statistics" in top else None)
    pressure = _pressure(top["pressure"]) if "pressure" in top else None
    if pressure is None:
        for index, (alert, metric) in enumerate(rows):
            if metric in PRESSURE_METRICS:
                raise ConfigError(f"alerts[{index}] ({alert}).metric: {metric} is recorded from "
                                  "the pressure section; add one (weights, caps, rate_window)")
    return statistics, pressure


def _whole_seconds(value: Any, where: str, low: float, high: float) -> float:
    seconds = validate.duration(value, where)
    if seconds != int(seconds) or not low <= seconds <= high:
        raise ConfigError(f"{where}: must be whole seconds between {range_name(low)} and "
                          f"{range_name(high)}, got {quoted(value)}")
    return seconds


def _load_statistics(raw: Any) -> LoadStatistics:
    section = validate.mapping(raw, "load_statistics", ("windows", "quantile"),
                               required=("windows", "quantile"))
    windows = section["windows"]
    if not isinstance(windows, list) or not 1 <= len(windows) <= _MAX_WINDOWS:
        raise ConfigError(f"load_statistics.windows: must be a list of 1 to {_MAX_WINDOWS} "
                          "durations such as [1h, 24h]")
    seen: list[float] = []
    for index, value in enumerate(windows):
        where = f"load_statistics.windows[{index}]"
        seconds = _whole_seconds(value, where, 1, _MAX_WINDOW)
        if seconds in seen:
            raise ConfigError(f"{where}: {range_name(seconds)} appears twice")
        seen.append(seconds)
    quantile = validate.quantity(section["quantile"], "load_statistics.quantile", "ratio", (0, 1),
                                 percent=True)
    percent = quantile * 100
    if not 0 < quantile < 1 or abs(percent - round(percent)) > 1e-9:
        raise ConfigError(f"load_statistics.quantile: must be a whole percentage between 1% and "
                          f"99% (it names the series, p95), got {quoted(section['quantile'])}")
    return LoadStatistics(tuple(seen), round(percent) / 100)


def _pressure(raw: Any) -> Pressure:
    keys = ("rate_window", "weights", "caps")
    section = validate.mapping(raw, "pressure", keys, required=keys)
    rate_window = _whole_seconds(section["rate_window"], "pressure.rate_window", 1,
                                 _MAX_RATE_WINDOW)
    weights = validate.mapping(section["weights"], "pressure.weights", RESOURCES, required=RESOURCES)
    caps = validate.mapping(section["caps"], "pressure.caps", RESOURCES, required=RESOURCES)
    weight_of = tuple((res, validate.quantity(weights[res], f"pressure.weights.{res}", "weight",
                                              (0, 1))) for res in RESOURCES)
    total = math.fsum(w for _, w in weight_of)
    if abs(total - 1) > 1e-9:
        raise ConfigError(f"pressure.weights: must add up to 1 (a score of 1 is every resource "
                          f"at its cap), got {total:.10g}")
    cap_of = []
    for res in RESOURCES:
        cap = validate.quantity(caps[res], f"pressure.caps.{res}", "ratio", (0, 1), percent=True)
        if cap <= 0:
            raise ConfigError(f"pressure.caps.{res}: must be above 0, got {quoted(caps[res])}")
        cap_of.append((res, cap))
    return Pressure(rate_window, weight_of, tuple(cap_of))


def range_name(seconds: float) -> str:
    """A window as a PromQL range and a series name suffix: 24h, not 1d (the issue's words)."""
    whole = int(seconds)
    if whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{whole}s"


