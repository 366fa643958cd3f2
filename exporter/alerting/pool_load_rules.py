"""Load statistics and node pressure: their sections of the threshold table and their rules.

Issue 20. Two optional sections of ``rules/thresholds.yaml``, validated with the rest
of the table (:func:`exporter.thresholds.sections.parse_sections`), and the recording rules
generated from them (:func:`recording_groups`), which this module holds:

- ``load_statistics``: for each window, the mean, population standard deviation and
  a quantile (``avg_over_time``, ``stddev_over_time``, ``quantile_over_time``) of GPU
  utilisation and of the demand ratio, per pool and for the cluster. They are taken
  over series recorded in the same rule group, just before them: rules of a group run
  in order and each commits before the next, so a statistic at time T sees exactly the
  samples its range holds at T, including the one written at T. The in-process
  statistics (:func:`exporter.pool_load.stats.window_stats`) are defined the same way, and
  ``tests/test_load_rules_e2e.py`` shows the two agree on a real Prometheus.
- ``pressure``: the node pressure score from node_exporter's standard series,
  ``sum(weight * min(value / cap, 1))`` over CPU, memory and disk I/O. Its bands are
  ordinary alert rows (``node_cpu_busy``, ``node_memory_used``, ``node_disk_io_busy``,
  ``node_pressure_score``): warning is the medium band's lower bound, critical the
  high band's, so the alerts, the dashboards and the bands are the same numbers.
"""

from __future__ import annotations

from typing import Any

from exporter import metrics
from exporter.thresholds import recorded
from exporter.thresholds.sections import RESOURCES, LoadStatistics, Pressure, range_name
from exporter.thresholds.table_metrics import promql_number

_PENDING = metrics.PENDING_GPUS.name
_ALLOCATED = recorded.POOL_ALLOCATED
RESOURCE_SERIES = {"cpu": recorded.NODE_CPU_BUSY, "memory": recorded.NODE_MEMORY_USED,
                   "io": recorded.NODE_DISK_IO_BUSY}

# The load statistics' inputs: (level, recorded series, its expression or None where an
# existing pool rule records it). Pool capacity is every GPU the exporters list; demand is
# what jobs hold plus what waiting jobs ask for, so it exceeds 1 when jobs queue.
_PENDING_BY_POOL = (
    # the pending family has a series only for pools with waiting jobs: the others get 0
    "(\n"
    f"  sum by (cluster, pool) ({_PENDING})\n"
    "  or on (cluster, pool)\n"
    f"  sum by (cluster, pool) (0 * {_ALLOCATED})\n"
    ")"
)
LOAD_INPUTS: tuple[tuple[str, str | None], ...] = (
    (recorded.POOL_UTILIZATION, None),  # RECORDING_GROUPS in rules.py records it
    # per pool, not per (pool, model): pending GPUs carry no model, and a pool of two models
    # (a pool label) would count its waiting jobs once per model; exporter/pool_load/tracker.py's
    # pool_samples, which the statistics are checked against, is per pool too
    (recorded.POOL_CAPACITY, f"count by (cluster, pool) ({metrics.GPU_INFO.name})"),
    (recorded.POOL_DEMAND,
     f"(\n  sum by (cluster, pool) ({_ALLOCATED})\n  + on (cluster, pool)\n"
     + "\n".join("  " + line for line in _PENDING_BY_POOL.splitlines())
     + f"\n)\n/ {recorded.POOL_CAPACITY}"),
    (recorded.CLUSTER_UTILIZATION,
     f"avg by (cluster) ({metrics.GPU_UTILIZATION_RATIO.name})"),
    (recorded.CLUSTER_DEMAND,
     f"(\n  sum by (cluster) ({_ALLOCATED})\n"
     "  + on (cluster)\n"
     "  (\n"
     f"    sum by (cluster) ({_PENDING})\n"
     "    or on (cluster)\n"
     f"    sum by (cluster) (0 * {_ALLOCATED})\n"
     "  )\n)\n"
     f"/ sum by (cluster) ({recorded.POOL_CAPACITY})"),
)
STATISTIC_SOURCES = (recorded.POOL_UTILIZATION, recorded.POOL_DEMAND, recorded.CLUSTER_UTILIZATION,
                     recorded.CLUSTER_DEMAND)

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
                 "expr": f"quantile_over_time({promql_number(statistics.quantile)}, {source}[{span}])"},
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
        f"{promql_number(pressure.weight(res))} * clamp_max({RESOURCE_SERIES[res]} / "
        f"{promql_number(pressure.cap(res))}, 1)" for res in RESOURCES)
    return [
        {"record": recorded.NODE_CPU_BUSY,
         "expr": f'1 - avg without (cpu, mode) (rate(node_cpu_seconds_total{{mode="idle"}}'
                 f"[{span}]))"},
        {"record": recorded.NODE_MEMORY_USED,
         "expr": "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes"},
        {"record": recorded.NODE_DISK_IO_BUSY,
         "expr": f"clamp_max(\n  max without (device) (rate(node_disk_io_time_seconds_total"
                 f"[{span}])),\n  1\n)"},
        {"record": recorded.NODE_PRESSURE_SCORE, "expr": terms},
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
    "LOAD_INPUTS",
    "STATISTIC_SOURCES",
    "load_statistics_rules",
    "pressure_rules",
    "recording_groups",
    "statistic_names",
]
