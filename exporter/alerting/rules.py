"""Prometheus alerting and recording rules, generated from the threshold table.

Both severities of an alert come from one function (:func:`_alert_rule`), so
a knob can never reach only half of a pair, and ``runbook_url`` (the table's
``runbook_base_url`` and the row's anchor) plus the
table's labels are added to every alert in that same place. The output is
plain data dumped in a fixed order, so the same table always gives the same
bytes; the committed files under ``rules/`` are checked against it.

Rules that get the semantics right rather than the syntax:

- utilization-low is per job (recorded over the job's GPUs), and NVLink-low
  looks only at busy GPUs of multi-GPU jobs; otherwise every idle GPU would fire;
- job metadata (``gpufleet_gpu_allocation_info``'s job, pod...) is
  aggregated away or joined with ``and``, which keeps the left-hand labels
  only, so a pod being replaced never restarts a ``for`` clock; the per-job
  series keep only what is constant for a job (its name, account, GPU count);
- every aggregation keeps ``cluster``, so one Prometheus may hold several;
- the ``page`` label says what pages (the table's ``page`` column): routing
  follows it, not the severity.
- power at the cap compares with ``>=``: the cap stops the draw from ever
  exceeding it; its levels are fractions of each GPU's own enforced limit
  (the power limit family), except for models the table gives watts
  (the reference cluster's H200 row), and a GPU that reports no limit falls back
  to the same fraction of its model's catalogue TDP.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from exporter import metrics
from exporter.alerting import pool_load_rules, recorded
from exporter.alerting.queries import QUERIES
from exporter.durations import format_duration
from exporter.thresholds import AlertRow, Level, Thresholds

FORMATS = ("prometheus", "prometheusrule")
ALERTS_FILE = "gpufleet-alerts.yaml"
RECORDING_FILE = "gpufleet-recording.yaml"
PROMETHEUSRULE_FILE = "gpufleet-prometheusrule.yaml"

# Per-GPU series are joined on the GPU's place, not on every label: `and`
# needs no one-to-one match, so two exporters scraping one fleet still work.
# `cluster` (the exporter's `cluster` setting) keeps two clusters' gpu-001 apart.
GPU_MATCH = "on (cluster, node, gpu)"


@dataclass(frozen=True, slots=True)
class Recording:
    record: str
    expr: str


_UTILIZATION = metrics.GPU_UTILIZATION_RATIO.name
_ALLOCATED = metrics.GPU_ALLOCATED_RATIO.name
_ALLOCATION_INFO = metrics.GPU_ALLOCATION_INFO.name
_MEMORY_USED = metrics.GPU_MEMORY_USED_BYTES.name
_MEMORY_TOTAL = metrics.GPU_MEMORY_TOTAL_BYTES.name

# level:metric:operations (https://prometheus.io/docs/practices/rules/); the names are
# exporter/alerting/recorded.py's
RECORDING_GROUPS: tuple[tuple[str, tuple[Recording, ...]], ...] = (
    ("gpufleet-gpu-recording", (
        Recording(
            recorded.GPU_NVLINK_UTILIZATION,
            f"(\n  rate({metrics.GPU_NVLINK_TRANSMIT_BYTES_TOTAL.name}[5m])\n"
            f"  + rate({metrics.GPU_NVLINK_RECEIVE_BYTES_TOTAL.name}[5m])\n)\n"
            f"/ {metrics.GPU_NVLINK_CAPACITY_BYTES_PER_SECOND.name}",
        ),
        Recording(recorded.GPU_MEMORY_USED, f"{_MEMORY_USED} / {_MEMORY_TOTAL}"),
    )),
    ("gpufleet-job-recording", (
        # Each GPU a job holds, with the job's labels: allocation_info is one series per
        # (job, GPU), utilization one per GPU, so group_left copies the GPU's value to
        # each job on it (time-sliced GPUs count every job's work together).
        Recording(
            recorded.JOB_GPU_UTILIZATION,
            f"{_ALLOCATION_INFO}\n"
            "* on (cluster, node, gpu) group_left\n"
            f"  {_UTILIZATION}",
        ),
        # Only what is constant for a job: a replaced pod must not restart an alert's clock.
        Recording(
            recorded.JOB_UTILIZATION,
            "avg by (cluster, exported_job, account, job_gpus) "
            f"({recorded.JOB_GPU_UTILIZATION})",
        ),
        # Idle GPU-equivalents now; averaged over an hour, the GPU-hours idle in that hour.
        Recording(
            recorded.JOB_IDLE,
            "sum by (cluster, exported_job, account) "
            f"(1 - {recorded.JOB_GPU_UTILIZATION})",
        ),
    )),
    ("gpufleet-pool-recording", (
        Recording(recorded.POOL_UTILIZATION, f"avg by (cluster, pool, model) ({_UTILIZATION})"),
        Recording(
            recorded.POOL_MEMORY_USED,
            f"sum by (cluster, pool, model) ({_MEMORY_USED})\n"
            f"/ sum by (cluster, pool, model) ({_MEMORY_TOTAL})",
        ),
        Recording(recorded.POOL_ALLOCATED, f"sum by (cluster, pool, model) ({_ALLOCATED})"),
        Recording(
            recorded.POOL_IDLE,
            # `== bool` keeps a 0 for pools with no idle GPU, where count() would drop them;
            # a lost GPU is not idle capacity. Matched on the GPU's place: the allocation may
            # come from cluster mode (Slurm) and gpu_up from the node's exporter. group_left:
            # a one-to-one match `on` keeps only those labels, losing the pool and model.
            "sum by (cluster, pool, model) (\n"
            f"  ({_ALLOCATED} == bool 0)\n"
            "  * on (cluster, node, gpu) group_left ()\n"
            f"  {metrics.GPU_UP.name}\n)",
        ),
    )),
)

_GROUP_OF_SUBJECT = {"gpu": "gpufleet-gpu", "job": "gpufleet-job", "pool": "gpufleet-cluster",
                     "cluster": "gpufleet-cluster", "source": "gpufleet-exporter",
                     "target": "gpufleet-exporter", "advisor": "gpufleet-exporter",
                     "node": "gpufleet-node"}
_RELATION = {"<": "below", ">": "above", ">=": "at or above", "==": "equal to"}
_HUMANISED = {
    "ratio": "{{ $value | humanizePercentage }}",
    "celsius": '{{ $value | printf "%.1f" }} °C',
    "watts": '{{ $value | printf "%.0f" }} W',
    "index": '{{ $value | printf "%.0f" }}',
    "state": "{{ $value }}",
    "count": '{{ $value | printf "%.0f" }}',
    "seconds": "{{ $value | humanizeDuration }}",
}


@dataclass(frozen=True, slots=True)
class GeneratedFile:
    name: str  # file name inside the output folder
    text: str


def _number(value: float) -> str:
    """A PromQL literal: 0.3, 650, 325.5; never 650.0 or 0.30000000000000004."""
    return f"{value:.10g}"


def _threshold_text(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value * 100:.10g}%"
    if unit == "celsius":
        return f"{value:.10g} °C"
    if unit == "watts":
        return f"{value:.10g} W"
    if unit == "seconds":
        return format_duration(value)  # 30m, as the table writes it
    return f"{value:.10g}"


def _regex_alternatives(names: tuple[str, ...]) -> str:
    """An RE2 alternation of literal names, escaped for a PromQL double-quoted string."""
    special = set(r".+*?()[]{}|^$\\")
    return "|".join("".join(f"\\\\{c}" if c in special else c for c in name) for name in names)


def _scoped(thresholds: Thresholds, row: AlertRow, comparison: str) -> str:
    """The comparison restricted to the GPUs the row's scope covers."""
    busy = _number(thresholds.busy_utilization)
    busy_gpus = f"and {GPU_MATCH}\n  {_UTILIZATION} > {busy}"
    if row.scope == "allocated":
        return f"{comparison}\nand {GPU_MATCH}\n  {_ALLOCATED} > 0"
    if row.scope == "busy":
        return f"{comparison}\n{busy_gpus}"
    if row.scope == "power_capped_busy":
        # a GPU at its cap is normal; one whose clocks the cap held down half of the last
        # 5 min is slowed by it (GPUs without clock-event reasons never match)
        return (f"{comparison}\n{busy_gpus}\nand {GPU_MATCH}\n"
                f'  avg_over_time({metrics.GPU_CLOCK_EVENT_ACTIVE.name}{{reason="sw_power_cap"}}[5m])'
                " >= 0.5")
    if row.scope == "busy_multi_gpu":
        # job_gpus is the job's GPU count as a label; counting by GPU drops the job's
        # name and pod, so a replaced pod leaves the alert's clock running.
        return (f"{comparison}\n{busy_gpus}\n"
                f"and {GPU_MATCH}\n"
                f'  count by (cluster, node, gpu) ({_ALLOCATION_INFO}{{job_gpus!~"0|1"}})')
    return comparison


def _value_expr(thresholds: Thresholds, row: AlertRow) -> str:
    xids = "|".join(str(code) for code, _ in thresholds.critical_xids)
    return (QUERIES[row.metric.key].expr
            .replace("{exporter_jobs}", _regex_alternatives(thresholds.exporter_jobs))
            .replace("{critical_xids}", xids))


def _absent_exprs(thresholds: Thresholds, row: AlertRow) -> list[str]:
    """One ``absent()`` per job: absent() of a regex selector fires only when every job is
    gone, and without the job label; per job, a job service discovery lost fires on its own.
    Of the plain selector, not of an aggregation around it: ``absent(up{job="x"})`` carries
    ``job="x"``, ``absent(max by (job) (...))`` carries nothing."""
    found = re.search(r'[a-z_:]+\{job=~"\{exporter_jobs\}"\}', QUERIES[row.metric.key].expr)
    assert found, f"{row.metric.key}: absent_too needs a selector on {{exporter_jobs}}"
    return [found.group(0).replace('job=~"{exporter_jobs}"', f'job="{job}"')
            for job in thresholds.exporter_jobs]


def _alert_rule(thresholds: Thresholds, row: AlertRow, level: Level, expr: str,
                threshold_text: str, for_scale: float,
                model: str | None = None) -> dict[str, Any]:
    """One alerting rule. Every alert of every severity is built here, and only here.

    A per-model rule also sets ``model`` as a static label (the value its
    selector already matches), so that no two rules share a name and label set
    (promtool's duplicate-rules lint).
    """
    for_text = format_duration(level.for_seconds * for_scale)
    description = (QUERIES[row.metric.key].describe
                   .replace("<VALUE>", _HUMANISED[row.metric.unit])
                   .replace("<RELATION>", _RELATION[row.op])
                   .replace("<THRESHOLD>", threshold_text)
                   .replace("<FOR>", for_text))
    return {
        "alert": row.alert,
        "expr": expr,
        "for": for_text,
        "labels": {"severity": level.severity,
                   "page": "true" if row.page and level.severity == "critical" else "false",
                   **({"model": model} if model else {}), **dict(row.labels)},
        "annotations": {
            "summary": row.summary,
            "description": f"{description} {row.action}",
            "runbook_url": f"{thresholds.runbook_base_url}#{row.runbook}",
        },
    }


def _row_rules(thresholds: Thresholds, row: AlertRow, for_scale: float) -> list[dict[str, Any]]:
    value = _value_expr(thresholds, row)
    query = QUERIES[row.metric.key]
    unit = row.metric.unit
    rules = []
    for level in row.levels:
        if not row.metric.relative_to_tdp:
            comparison = f"{value} {row.op} {_number(level.threshold)}"
            if query.absent_too:
                comparison = "\nor\n".join(
                    [comparison, *(f"absent({e})" for e in _absent_exprs(thresholds, row))])
            rules.append(_alert_rule(thresholds, row, level, _scoped(thresholds, row, comparison),
                                     _threshold_text(level.threshold, unit), for_scale))
            continue
        # 1. models the table gives watts of their own (the reference cluster's H200 row)
        for model in (m for m in row.models if m.from_table):
            watts = model.threshold(level.severity)
            assert watts is not None  # the loader gives every model every severity
            comparison = f'{value}{{model="{model.model}"}} {row.op} {_number(watts)}'
            rules.append(_alert_rule(thresholds, row, level, _scoped(thresholds, row, comparison),
                                     _threshold_text(watts, unit), for_scale, model.model))
        # 2. every other GPU against its own enforced limit, which is measured, not guessed:
        # a PCIe or NVL part capped below its model's TDP reaches its level, and a B200
        # whose site caps it below 1000 W warns near that cap, not at 930 W
        table = _regex_alternatives(tuple(m.model for m in row.models if m.from_table))
        selector = f'{value}{{model!~"{table}"}}' if table else value
        fraction = level.threshold
        cap = query.cap if fraction == 1 else f"{_number(fraction)} * {query.cap}"
        rules.append(_alert_rule(
            thresholds, row, level, _scoped(thresholds, row, f"{selector} {row.op} {cap}"),
            f"{fraction * 100:.10g}% of its power limit", for_scale,
        ))
        # 3. a GPU that reports no limit: the same fraction of its model's catalogue TDP
        for model in (m for m in row.models if not m.from_table):
            watts = model.threshold(level.severity)
            assert watts is not None
            comparison = (f'{value}{{model="{model.model}"}} {row.op} {_number(watts)}\n'
                          f"unless {GPU_MATCH}\n  {query.cap}")
            rules.append(_alert_rule(
                thresholds, row, level, _scoped(thresholds, row, comparison),
                f"{_threshold_text(watts, unit)} ({fraction * 100:.10g}% of its catalogue TDP: "
                "no power limit reported)", for_scale, model.model))
    return rules


def alert_groups(thresholds: Thresholds, for_scale: float = 1.0) -> list[dict[str, Any]]:
    """Alerting rule groups, one per kind of object, in the table's order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in thresholds.alerts:
        name = _GROUP_OF_SUBJECT[row.metric.subject]
        groups.setdefault(name, []).extend(_row_rules(thresholds, row, for_scale))
    return [{"name": name, "rules": rules} for name, rules in groups.items()]


def recording_groups(thresholds: Thresholds | None = None) -> list[dict[str, Any]]:
    """The fixed groups, plus what the table's load_statistics and pressure sections
    generate (exporter/alerting/pool_load_rules.py) when ``thresholds`` is given."""
    static = [
        {"name": name, "rules": [{"record": r.record, "expr": r.expr} for r in recordings]}
        for name, recordings in RECORDING_GROUPS
    ]
    if thresholds is None:
        return static
    return pool_load_rules.recording_groups(thresholds.load_statistics, thresholds.pressure, static)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks; no anchors; no line folding."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=10_000,
                     default_flow_style=False)


def _header(thresholds: Thresholds, for_scale: float) -> str:
    lines = [f"# Generated by `gpufleet rules` from {thresholds.source}: edit that table and "
             "run `gpufleet rules`, never this file."]
    if for_scale != 1:
        lines.append(f"# Every `for` is scaled by {for_scale:g} (--for-scale): for tests only.")
    return "\n".join(lines) + "\n"


def generate(thresholds: Thresholds, fmt: str = "prometheus", for_scale: float = 1.0,
             labels: Mapping[str, str] | None = None) -> list[GeneratedFile]:
    """The generated files for one format, as text; nothing is written here.

    ``labels`` go on the PrometheusRule object, after gpufleet's own (kube-prometheus-stack
    selects rules by ``release: <its release name>``).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if not (math.isfinite(for_scale) and for_scale > 0):
        raise ValueError(f"for_scale must be a positive number, got {for_scale!r}")
    header = _header(thresholds, for_scale)
    alerts = alert_groups(thresholds, for_scale)
    recordings = recording_groups(thresholds)
    if fmt == "prometheus":
        return [
            GeneratedFile(ALERTS_FILE, header + _dump({"groups": alerts})),
            GeneratedFile(RECORDING_FILE, header + _dump({"groups": recordings})),
        ]
    rule_object = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpufleet",
            "labels": {"app.kubernetes.io/name": "gpufleet",
                       "app.kubernetes.io/component": "alerting", **(labels or {})},
        },
        "spec": {"groups": recordings + alerts},
    }
    return [GeneratedFile(PROMETHEUSRULE_FILE, header + _dump(rule_object))]


__all__ = [
    "ALERTS_FILE",
    "FORMATS",
    "PROMETHEUSRULE_FILE",
    "RECORDING_FILE",
    "RECORDING_GROUPS",
    "GeneratedFile",
    "alert_groups",
    "generate",
    "recording_groups",
]
