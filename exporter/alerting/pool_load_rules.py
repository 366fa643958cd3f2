"""Load statistics and node pressure: their sections of the threshold table and their rules.

Issue 20. Two optional sections of ``rules/thresholds.yaml``, validated with the rest
of the table (:func:`parse_sections`, called by
:func:`exporter.alerting.thresholds.parse_thresholds`), and the recording rules
generated from them (:func:`recording_groups`):

- ``load_statistics``: for each window, the mean, population standard deviation and
  a quantile (``avg_over_time``, ``stddev_over_time``, ``quantile_over_time``) of GPU
  utilisation and of the demand ratio, per pool and for the cluster. They are taken
  over series recorded in the same rule group, just before them: rules of a group run
  in order and each commits before the next, so a statistic at time T sees exactly the
  samples its range holds at T, including the one written at T. The in-process
  statistics (:func:`exporter.load.stats.window_stats`) are defined the same way, and
  ``tests/test_load_rules_e2e.py`` shows the two agree on a real Prometheus.
- ``pressure``: the node pressure score from node_exporter's standard series,
  ``sum(weight * min(value / cap, 1))`` over CPU, memory and disk I/O. Its bands are
  ordinary alert rows (``node_cpu_busy``, ``node_memory_used``, ``node_disk_io_busy``,
  ``node_pressure_score``): warning is the medium band's lower bound, critical the
  high band's, so the alerts, the dashboards and the bands are the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # thresholds.py imports this module inside parse_thresholds
    from exporter.alerting.table_reader import _Reader

# The recorded series the pressure rows compare (METRICS in thresholds.py names them too;
# tests/test_load_rules.py checks the two agree).
CPU_BUSY = "instance:gpufleet_node_cpu_busy:ratio"
MEMORY_USED = "instance:gpufleet_node_memory_used:ratio"
DISK_IO_BUSY = "instance:gpufleet_node_disk_io_busy:ratio"
PRESSURE_SCORE = "instance:gpufleet_node_pressure:score"
RESOURCES = ("cpu", "memory", "io")  # the score's terms, in the order
RESOURCE_SERIES = {"cpu": CPU_BUSY, "memory": MEMORY_USED, "io": DISK_IO_BUSY}
PRESSURE_METRICS = ("node_cpu_busy", "node_memory_used", "node_disk_io_busy",
                    "node_pressure_score")  # rows comparing these need the pressure section

# The load statistics' inputs: (level, recorded series, its expression or None where an
# existing pool rule records it). Pool capacity is every GPU the exporters list; demand is
# what jobs hold plus what waiting jobs ask for, so it exceeds 1 when jobs queue.
POOL_UTILIZATION = "pool:gpufleet_gpu_utilization:avg"
POOL_DEMAND = "pool:gpufleet_demand:ratio"
CLUSTER_UTILIZATION = "cluster:gpufleet_gpu_utilization:avg"
CLUSTER_DEMAND = "cluster:gpufleet_demand:ratio"
POOL_CAPACITY = "pool:gpufleet_gpu_capacity:count"
_PENDING_BY_POOL = (
    # gpufleet_pending_gpus has a series only for pools with waiting jobs: the others get 0
    "(\n"
    "  sum by (cluster, pool) (gpufleet_pending_gpus)\n"
    "  or on (cluster, pool)\n"
    "  sum by (cluster, pool) (0 * pool:gpufleet_gpu_allocated:sum)\n"
    ")"
)
LOAD_INPUTS: tuple[tuple[str, str | None], ...] = (
    (POOL_UTILIZATION, None),  # RECORDING_GROUPS in rules.py records it
    # per pool, not per (pool, model): pending GPUs carry no model, and a pool of two models
    # (a pool label) would count its waiting jobs once per model; exporter/load/live.py's
    # pool_samples, which the statistics are checked against, is per pool too
    (POOL_CAPACITY, "count by (cluster, pool) (gpufleet_gpu_info)"),
    (POOL_DEMAND,
     "(\n  sum by (cluster, pool) (pool:gpufleet_gpu_allocated:sum)\n  + on (cluster, pool)\n"
     + "\n".join("  " + line for line in _PENDING_BY_POOL.splitlines())
     + f"\n)\n/ {POOL_CAPACITY}"),
    (CLUSTER_UTILIZATION, "avg by (cluster) (gpufleet_gpu_utilization_ratio)"),
    (CLUSTER_DEMAND,
     "(\n  sum by (cluster) (pool:gpufleet_gpu_allocated:sum)\n"
     "  + on (cluster)\n"
     "  (\n"
     "    sum by (cluster) (gpufleet_pending_gpus)\n"
     "    or on (cluster)\n"
     "    sum by (cluster) (0 * pool:gpufleet_gpu_allocated:sum)\n"
     "  )\n)\n"
     f"/ sum by (cluster) ({POOL_CAPACITY})"),
)
STATISTIC_SOURCES = (POOL_UTILIZATION, POOL_DEMAND, CLUSTER_UTILIZATION, CLUSTER_DEMAND)

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


def parse_sections(r: _Reader, top: Mapping[str, Any], rows: tuple[tuple[str, str], ...]
                   ) -> tuple[LoadStatistics | None, Pressure | None]:
    """Both sections, each ``None`` when the table has none (no rules are generated then);
    ``rows`` are the alert rows' (alert name, metric key).

    A row comparing a pressure series needs the ``pressure`` section: without it nothing
    records the series, and the alert would never fire.
    """
    statistics = (_load_statistics(r, top["load_statistics"])
                  if "load_statistics" in top else None)
    pressure = _pressure(r, top["pressure"]) if "pressure" in top else None
    if pressure is None:
        for index, (alert, metric) in enumerate(rows):
            if metric in PRESSURE_METRICS:
                raise r.fail(f"alerts[{index}] ({alert}).metric",
                             f"{metric} is recorded from the pressure section; "
                             "add one (weights, caps, rate_window)")
    return statistics, pressure


def _whole_seconds(r: _Reader, value: Any, where: str, low: float, high: float) -> float:
    seconds = r.duration(value, where)
    if seconds != int(seconds) or not low <= seconds <= high:
        raise r.fail(where, f"must be whole seconds between {range_name(low)} and "
                            f"{range_name(high)}, got {value!r}")
    return seconds


def _load_statistics(r: _Reader, raw: Any) -> LoadStatistics:
    section = r.mapping(raw, "load_statistics", ("windows", "quantile"),
                        required=("windows", "quantile"))
    windows = section["windows"]
    if not isinstance(windows, list) or not 1 <= len(windows) <= _MAX_WINDOWS:
        raise r.fail("load_statistics.windows",
                     f"must be a list of 1 to {_MAX_WINDOWS} durations such as [1h, 24h]")
    seen: list[float] = []
    for index, value in enumerate(windows):
        where = f"load_statistics.windows[{index}]"
        seconds = _whole_seconds(r, value, where, 1, _MAX_WINDOW)
        if seconds in seen:
            raise r.fail(where, f"{range_name(seconds)} appears twice")
        seen.append(seconds)
    quantile = r.number(section["quantile"], "load_statistics.quantile", "ratio", True, (0, 1))
    percent = quantile * 100
    if not 0 < quantile < 1 or abs(percent - round(percent)) > 1e-9:
        raise r.fail("load_statistics.quantile",
                     f"must be a whole percentage between 1% and 99% (it names the series, "
                     f"p95), got {section['quantile']!r}")
    return LoadStatistics(tuple(seen), round(percent) / 100)


def _pressure(r: _Reader, raw: Any) -> Pressure:
    keys = ("rate_window", "weights", "caps")
    section = r.mapping(raw, "pressure", keys, required=keys)
    rate_window = _whole_seconds(r, section["rate_window"], "pressure.rate_window", 1,
                                 _MAX_RATE_WINDOW)
    weights = r.mapping(section["weights"], "pressure.weights", RESOURCES, required=RESOURCES)
    caps = r.mapping(section["caps"], "pressure.caps", RESOURCES, required=RESOURCES)
    weight_of = tuple((res, r.number(weights[res], f"pressure.weights.{res}", "weight", False,
                                     (0, 1))) for res in RESOURCES)
    total = math.fsum(w for _, w in weight_of)
    if abs(total - 1) > 1e-9:
        raise r.fail("pressure.weights", f"must add up to 1 (a score of 1 is every resource "
                                         f"at its cap), got {total:.10g}")
    cap_of = []
    for res in RESOURCES:
        cap = r.number(caps[res], f"pressure.caps.{res}", "ratio", True, (0, 1))
        if cap <= 0:
            raise r.fail(f"pressure.caps.{res}", f"must be above 0, got {caps[res]!r}")
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


def _number(value: float) -> str:
    return f"{value:.10g}"


def statistic_name(source: str, statistic: str, window: float) -> str:
    """``pool:gpufleet_gpu_utilization:avg`` -> ``pool:gpufleet_gpu_utilization:avg_mean1h``.

    ``statistic`` is ``mean``, ``stddev`` or ``p95`` (the quantile's percentage); the
    operations part of the name grows, as Prometheus' naming practice has it.
    """
    suffix = f"{statistic}_{range_name(window)}" if statistic.startswith("p") else (
        f"{statistic}{range_name(window)}")
    return f"{source}_{suffix}"


def statistic_names(statistics: LoadStatistics, source: str, window: float) -> dict[str, str]:
    """The three series recorded for ``source`` over ``window``: mean, stddev, quantile."""
    quantile = f"p{round(statistics.quantile * 100)}"
    return {"mean": statistic_name(source, "mean", window),
            "stddev": statistic_name(source, "stddev", window),
            "quantile": statistic_name(source, quantile, window)}


def load_statistics_rules(statistics: LoadStatistics) -> list[dict[str, str]]:
    """The inputs, then per window and input its mean, stddev and quantile, in that order."""
    rules = [{"record": name, "expr": expr} for name, expr in LOAD_INPUTS if expr is not None]
    for window in statistics.windows:
        span = range_name(window)
        for source in STATISTIC_SOURCES:
            names = statistic_names(statistics, source, window)
            rules += [
                {"record": names["mean"], "expr": f"avg_over_time({source}[{span}])"},
                {"record": names["stddev"], "expr": f"stddev_over_time({source}[{span}])"},
                {"record": names["quantile"],
                 "expr": f"quantile_over_time({_number(statistics.quantile)}, {source}[{span}])"},
            ]
    return rules


def pressure_rules(pressure: Pressure) -> list[dict[str, str]]:
    """Each resource's ratio, then the score from them (same group: the score at T reads
    the ratios recorded at T).

    - CPU: 1 - the idle share, averaged over the node's CPUs; iowait counts as busy
      (``node_cpu_seconds_total`` minus idle, as the issue defines it).
    - memory: 1 - MemAvailable / MemTotal (the kernel's estimate of what can be allocated
      without swapping, not MemFree).
    - I/O: the busiest device's share of time with I/O in flight; capped at 1, which
      rate() can pass by a scrape's jitter.
    """
    span = range_name(pressure.rate_window)
    terms = "\n+ ".join(
        f"{_number(pressure.weight(res))} * clamp_max({RESOURCE_SERIES[res]} / "
        f"{_number(pressure.cap(res))}, 1)" for res in RESOURCES)
    return [
        {"record": CPU_BUSY,
         "expr": f'1 - avg without (cpu, mode) (rate(node_cpu_seconds_total{{mode="idle"}}'
                 f"[{span}]))"},
        {"record": MEMORY_USED,
         "expr": "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes"},
        {"record": DISK_IO_BUSY,
         "expr": f"clamp_max(\n  max without (device) (rate(node_disk_io_time_seconds_total"
                 f"[{span}])),\n  1\n)"},
        {"record": PRESSURE_SCORE, "expr": terms},
    ]


LOAD_GROUP = "gpufleet-pool-recording"  # the statistics follow the pool series they read
PRESSURE_GROUP = "gpufleet-node-pressure"


def recording_groups(statistics: LoadStatistics | None, pressure: Pressure | None,
                     static: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``static`` (rules.py's fixed groups) with the load rules appended to the pool group,
    and the pressure group after them; each only when its section is in the table."""
    groups = [{"name": g["name"], "rules": list(g["rules"])} for g in static]
    if statistics is not None:
        pool = next(g for g in groups if g["name"] == LOAD_GROUP)
        pool["rules"] += load_statistics_rules(statistics)
    if pressure is not None:
        groups.append({"name": PRESSURE_GROUP, "rules": pressure_rules(pressure)})
    return groups


__all__ = [
    "CLUSTER_DEMAND",
    "CLUSTER_UTILIZATION",
    "CPU_BUSY",
    "DISK_IO_BUSY",
    "MEMORY_USED",
    "POOL_DEMAND",
    "POOL_UTILIZATION",
    "PRESSURE_SCORE",
    "RESOURCES",
    "LoadStatistics",
    "Pressure",
    "load_statistics_rules",
    "parse_sections",
    "pressure_rules",
    "range_name",
    "recording_groups",
    "statistic_names",
]
