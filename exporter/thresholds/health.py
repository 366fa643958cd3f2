"""The ``health:`` section of rules/thresholds.yaml (issue 31): every duration, count, rate
and budget of the health verdicts, remediation and stragglers.

    health:
      verdicts:                 # exporter/health/verdict.py
        xid_recent: 10m         # a critical XID already counted at start is an event this recent
        lost_for: 5m            # not up this long: gpu_lost (failing)
        stale_for: 5m           # last good readings this long: stale (unknown)
        thermal_for: 5m         # a slowdown reason active this long: thermal (degraded)
        pending_for: 15m        # a remap waiting for a reset this long: remap_pending (degraded)
        clean_window: 15m       # without a signal before a verdict falls
        nvlink_link_errors_per_second: 0
        nvlink_crc_errors_per_second: 100
        pcie_replays_per_minute: 8
      remediation:              # exporter/health/remediation.py
        max_drained_nodes: 4    # drained by gpufleet at once, fleet-wide
        max_drained_pool_ratio: 25%
        min_healthy_nodes: 1
        max_drains_per_window: 6
        drain_window: 1h
        min_drain: 1h
        replace_after_faults: 3
        replace_window: 7d
        service_xids: [64, 92]
      stragglers:               # exporter/health/stragglers.py
        min_job_gpus: 4
        for: 10m
        mad_threshold: 3.5
        min_relative_deviation: 20%
        metrics: [sm_active, utilization, power, sm_clock]

The three settings classes live here, with the table, rather than in :mod:`exporter.health`
which acts on them (as :class:`~exporter.thresholds.scaling.ScalingSettings` does): their
defaults are the installed table's values (each field's default is read from it), so the
table is the one place a number is written. Validated with the rest of the table by the
one validator's file checks (:mod:`exporter.validate`), so a wrong value is a ThresholdError
naming the dotted key. A table may leave out the section or any key: the installed table's value
stands in (that table must name every key; :func:`parse_health` with ``installed=None``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter import validate
from exporter.errors import ConfigError, quoted
from exporter.metrics import CLOCK_EVENT_REASONS, SLOWDOWN_REASONS

STRAGGLER_METRICS = ("sm_active", "utilization", "power", "sm_clock")  # exporter/health/stragglers.py
MAX_DURATION_S = 31 * 86400.0  # a month: the longest window a row may set
MAX_COUNT = 1_000_000


def check_settings(section: str, settings: Any, minimum: dict[str, float] | None = None,
                   maximum: dict[str, float] | None = None) -> None:
    """Every number of ``settings`` finite and at least 0 (or its ``minimum``), at most its
    ``maximum``; ValueError ``<section>.<field>: ...`` otherwise."""
    minimum, maximum = minimum or {}, maximum or {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high = minimum.get(f.name, 0), maximum.get(f.name, math.inf)
        if not (math.isfinite(value) and low <= value <= high):
            bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f"at least {low:g}"
            raise ValueError(f"{section}.{f.name}: must be {bound}, got {value!r}")


# The installed table's health section, read once: exporter.thresholds.table provides it at
# import (it imports this module to parse the section, so this one cannot import it back).
# The package's __init__ imports the table module, so it is set before any field needs it.
_installed_table: Callable[[], HealthTable] | None = None
_installed_xids: Callable[[], tuple[int, ...]] | None = None


def provide_installed(health: Callable[[], HealthTable], xids: Callable[[], tuple[int, ...]]) -> None:
    """Called once by :mod:`exporter.thresholds.table`: how to read the installed table."""
    global _installed_table, _installed_xids
    _installed_table, _installed_xids = health, xids


def _installed(section: str, name: str) -> Callable[[], Any]:
    """A field's default: its value in the table installed with gpufleet (read once)."""

    def default() -> Any:
        assert _installed_table is not None  # exporter.thresholds.table set it at import
        return getattr(getattr(_installed_table(), section), name)
    return default


def _table_critical_xids() -> tuple[int, ...]:
    # the threshold table is the one place critical XIDs are listed (GpuXidError pages on them)
    assert _installed_xids is not None
    return _installed_xids()


def _slowdown_reasons() -> tuple[str, ...]:
    # the reasons GpuClocksThrottled and the dashboards count as a slowdown
    return tuple(SLOWDOWN_REASONS.split("|"))


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """Every duration and rate of the verdicts: the table's ``health.verdicts``."""

    critical_xids: tuple[int, ...] = field(default_factory=_table_critical_xids)
    slowdown_reasons: tuple[str, ...] = field(default_factory=_slowdown_reasons)
    # a critical XID already counted when the tracker starts is an event only this recent
    # (GpuXidError's 10 min): an exporter restart must not fail GPUs on yesterday's XIDs
    xid_recent_seconds: float = field(default_factory=_installed("verdicts", "xid_recent_seconds"))
    # GpuLost's `for`: one failed read is not a lost GPU
    lost_for_seconds: float = field(default_factory=_installed("verdicts", "lost_for_seconds"))
    # GpufleetSourceDown's `for`
    stale_for_seconds: float = field(default_factory=_installed("verdicts", "stale_for_seconds"))
    # GpuClocksThrottled's `for`
    thermal_for_seconds: float = field(default_factory=_installed("verdicts", "thermal_for_seconds"))
    # GpuRowRemapPending's `for`
    pending_for_seconds: float = field(default_factory=_installed("verdicts", "pending_for_seconds"))
    # without any signal of its level before a verdict falls
    clean_window_seconds: float = field(default_factory=_installed("verdicts", "clean_window_seconds"))
    # replays + recoveries: any (DCGM's limit is 1)
    nvlink_link_errors_per_second: float = field(
        default_factory=_installed("verdicts", "nvlink_link_errors_per_second"))
    # DCGM's health watch rate (GpuNvlinkCrcErrors)
    nvlink_crc_errors_per_second: float = field(
        default_factory=_installed("verdicts", "nvlink_crc_errors_per_second"))
    # DCGM's PCIe replay rate, 8 a minute
    pcie_replays_per_second: float = field(
        default_factory=_installed("verdicts", "pcie_replays_per_second"))

    def __post_init__(self) -> None:
        check_settings("health", self)

    def slowdown_mask(self) -> int:
        bits = dict(CLOCK_EVENT_REASONS)
        return sum(bits[name] for name in self.slowdown_reasons if name in bits)


@dataclass(frozen=True, slots=True)
class RemediationSettings:
    """Every count, share and duration of remediation: the table's ``health.remediation``."""

    # drained by gpufleet at once, in the whole fleet
    max_drained_nodes: int = field(default_factory=_installed("remediation", "max_drained_nodes"))
    # of a pool's nodes at once (at least one node)
    max_drained_pool_ratio: float = field(
        default_factory=_installed("remediation", "max_drained_pool_ratio"))
    # a pool keeps this many healthy nodes in service
    min_healthy_nodes: int = field(default_factory=_installed("remediation", "min_healthy_nodes"))
    # the rate limit ...
    max_drains_per_window: int = field(
        default_factory=_installed("remediation", "max_drains_per_window"))
    # ... over this window
    drain_window_seconds: float = field(
        default_factory=_installed("remediation", "drain_window_seconds"))
    # a flapping GPU does not cycle its node
    min_drain_seconds: float = field(default_factory=_installed("remediation", "min_drain_seconds"))
    # faults (a node turning failing) ...
    replace_after_faults: int = field(
        default_factory=_installed("remediation", "replace_after_faults"))
    # ... in this window
    replace_window_seconds: float = field(
        default_factory=_installed("remediation", "replace_window_seconds"))
    # XIDs a reset does not clear (64: a remap failed, 92: memory failing): they need service
    service_xids: tuple[int, ...] = field(default_factory=_installed("remediation", "service_xids"))

    def __post_init__(self) -> None:
        check_settings("remediation", self, minimum={"replace_after_faults": 1},
                       maximum={"max_drained_pool_ratio": 1.0})


@dataclass(frozen=True, slots=True)
class StragglerSettings:
    """Every count and duration of straggler detection: the table's ``health.stragglers``."""

    # fewer peers give no robust median
    min_job_gpus: int = field(default_factory=_installed("stragglers", "min_job_gpus"))
    # outside its peers this long without a break
    straggler_for_seconds: float = field(
        default_factory=_installed("stragglers", "straggler_for_seconds"))
    # robust z-score (Iglewicz and Hoaglin's outlier cut)
    mad_threshold: float = field(default_factory=_installed("stragglers", "mad_threshold"))
    # and at least this far from the median, relatively
    min_relative_deviation: float = field(
        default_factory=_installed("stragglers", "min_relative_deviation"))
    metrics: tuple[str, ...] = field(default_factory=_installed("stragglers", "metrics"))

    def __post_init__(self) -> None:
        check_settings("stragglers", self, minimum={"min_job_gpus": 3})


@dataclass(frozen=True, slots=True)
class HealthTable:
    """``health:``: the settings of the three parts, each complete."""

    verdicts: HealthSettings
    remediation: RemediationSettings
    stragglers: StragglerSettings


# table key -> (field, kind, bounds); kind: duration | whole | ratio | number | per_minute
_Spec = tuple[str, str, tuple[float, float]]
_DURATION = (0.0, MAX_DURATION_S)
_VERDICTS: dict[str, _Spec] = {
    "xid_recent": ("xid_recent_seconds", "duration", _DURATION),
    "lost_for": ("lost_for_seconds", "duration", _DURATION),
    "stale_for": ("stale_for_seconds", "duration", _DURATION),
    "thermal_for": ("thermal_for_seconds", "duration", _DURATION),
    "pending_for": ("pending_for_seconds", "duration", _DURATION),
    "clean_window": ("clean_window_seconds", "duration", _DURATION),
    "nvlink_link_errors_per_second": ("nvlink_link_errors_per_second", "number", (0, 1e9)),
    "nvlink_crc_errors_per_second": ("nvlink_crc_errors_per_second", "number", (0, 1e9)),
    "pcie_replays_per_minute": ("pcie_replays_per_second", "per_minute", (0, 1e9)),
}
_REMEDIATION: dict[str, _Spec] = {
    "max_drained_nodes": ("max_drained_nodes", "whole", (0, MAX_COUNT)),
    "max_drained_pool_ratio": ("max_drained_pool_ratio", "ratio", (0, 1)),
    "min_healthy_nodes": ("min_healthy_nodes", "whole", (0, MAX_COUNT)),
    "max_drains_per_window": ("max_drains_per_window", "whole", (0, MAX_COUNT)),
    "drain_window": ("drain_window_seconds", "duration", _DURATION),
    "min_drain": ("min_drain_seconds", "duration", _DURATION),
    "replace_after_faults": ("replace_after_faults", "whole", (1, 1000)),
    "replace_window": ("replace_window_seconds", "duration", _DURATION),
    "service_xids": ("service_xids", "xids", (1, 1000)),
}
_STRAGGLERS: dict[str, _Spec] = {
    "min_job_gpus": ("min_job_gpus", "whole", (3, MAX_COUNT)),
    "for": ("straggler_for_seconds", "duration", _DURATION),
    "mad_threshold": ("mad_threshold", "number", (0, 100)),
    "min_relative_deviation": ("min_relative_deviation", "ratio", (0, 1)),
    "metrics": ("metrics", "metrics", (1, len(STRAGGLER_METRICS))),
}
SECTIONS: dict[str, dict[str, _Spec]] = {
    "verdicts": _VERDICTS, "remediation": _REMEDIATION, "stragglers": _STRAGGLERS}
_CLASSES: dict[str, type] = {
    "verdicts": HealthSettings, "remediation": RemediationSettings, "stragglers": StragglerSettings}


def parse_health(raw: Any, critical_xids: tuple[int, ...],
                 installed: Callable[[], HealthTable] | None) -> HealthTable:
    """The ``health`` section (``raw`` None: the table has none). A key the table leaves out
    takes ``installed()``'s value; ``installed`` None (reading the installed table itself):
    every key is required, as that table holds every default."""
    section = validate.mapping(raw, "health", tuple(SECTIONS))
    built: dict[str, Any] = {}
    for part, specs in SECTIONS.items():
        where = f"health.{part}"
        given = validate.mapping(section.get(part, {}), where, tuple(specs))
        values: dict[str, Any] = {}
        for key, (name, kind, bounds) in specs.items():
            if key not in given:
                if installed is None:
                    raise ConfigError(f"{where}.{key}: required in the table installed with "
                                      "gpufleet (it holds every default)")
                values[name] = getattr(getattr(installed(), part), name)
                continue
            values[name] = _value(given[key], f"{where}.{key}", kind, bounds)
        if part == "verdicts":
            values["critical_xids"] = critical_xids
            values["slowdown_reasons"] = _slowdown_reasons()
        try:
            built[part] = _CLASSES[part](**values)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return HealthTable(built["verdicts"], built["remediation"], built["stragglers"])


def _value(value: Any, where: str, kind: str, bounds: tuple[float, float]) -> Any:
    low, high = bounds
    if kind == "duration":
        seconds = validate.duration(value, where)
        if not low <= seconds <= high:
            raise ConfigError(f"{where}: must be a duration from 0s to 31d, got {quoted(value)}")
        return seconds
    if kind == "whole":
        return validate.whole(value, where, int(low), int(high))
    if kind == "ratio":
        return validate.quantity(value, where, "ratio", bounds, percent=True)
    if kind == "number":
        return validate.quantity(value, where,
                                 "per second" if "per_second" in where else "number", bounds)
    if kind == "per_minute":
        return validate.quantity(value, where, "per minute", bounds) / 60
    if kind == "xids":
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list of XID numbers such as [64, 92], "
                              f"got {quoted(value)}")
        codes = tuple(validate.whole(code, f"{where}[{i}]", int(low), int(high))
                      for i, code in enumerate(value))
        if len(set(codes)) != len(codes):
            raise ConfigError(f"{where}: lists an XID twice: {list(codes)}")
        return tuple(sorted(codes))
    # metrics
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of {', '.join(STRAGGLER_METRICS)}, "
                          f"got {quoted(value)}")
    for i, name in enumerate(value):
        if name not in STRAGGLER_METRICS:
            raise ConfigError(f"{where}[{i}]: unknown metric {quoted(str(name)[:40])} (known: "
                              f"{', '.join(STRAGGLER_METRICS)})")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: lists a metric twice: {value}")
    return tuple(value)


__all__ = ["MAX_DURATION_S", "SECTIONS", "STRAGGLER_METRICS", "HealthSettings", "HealthTable",
           "RemediationSettings", "StragglerSettings", "check_settings", "parse_health"]
