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
  exceeding it. One rule per severity fires on power alone (no clock events needed,
  so dcgm-exporter's default counters work): models the table gives watts (the
  reference cluster's H200 row) against those, every other GPU against a fraction
  of the limit it is held to, the exporter's gauge (the enforced one or, where a GPU
  reports none, its model's catalogue TDP), with the power brake as the evidence of a
  fault. Being held back by its own cap is its own row (GpuPowerCapped);
- a driver lifetime counter (ECC, NVLink) alerts on its growth, never on its first
  appearance, the same on Prometheus and VictoriaMetrics (table_metrics.py's ``_growth``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import yaml

from exporter import metrics
from exporter.alerting import pool_load_rules
from exporter.durations import format_duration, parse_duration
from exporter.thresholds import AlertRow, Level, Thresholds, recorded
from exporter.thresholds.health import HealthTable
from exporter.thresholds.table_metrics import (
    EVENT_WINDOW_SECONDS,
    GPU_MATCH,
    promql_number,
    regex_alternatives,
    scope_filter,
    template_label,
)

FORMATS = ("prometheus", "prometheusrule")
ALERTS_FILE = "gpufleet-alerts.yaml"
RECORDING_FILE = "gpufleet-recording.yaml"
PROMETHEUSRULE_FILE = "gpufleet-prometheusrule.yaml"

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
# exporter/thresholds/recorded.py's
RECORDING_GROUPS: tuple[tuple[str, tuple[Recording, ...]], ...] = (
    # No recording per GPU: the memory-used ratio, the power limit a GPU is held to and its
    # NVLink utilisation are the exporter's own gauges (gpufleet_gpu_memory_used_ratio,
    # gpufleet_gpu_power_limit_effective_watts, gpufleet_gpu_nvlink_utilization_ratio): at
    # 10,880 GPUs recording them divided 10,880 series by 10,880 more every interval (0.79 s),
    # ran ten model regexes (0.58 s) and two rates over the NVLink byte counters with two
    # joins (0.15-1.5 s). The exporter keeps the counters' last 5 min for the NVLink rate.
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
    # The pool series the load statistics read stay in one group with them (pool_load_rules);
    # the others, each an aggregation over every GPU (the memory ratio 0.42 CPU s at 10,880
    # GPUs, two sums), are groups of their own, so the pool group keeps under 1 s.
    ("gpufleet-pool-recording", (
        Recording(recorded.POOL_UTILIZATION, f"avg by (cluster, pool, model) ({_UTILIZATION})"),
        Recording(recorded.POOL_ALLOCATED, f"sum by (cluster, pool, model) ({_ALLOCATED})"),
    )),
    ("gpufleet-pool-memory-recording", (
        Recording(
            recorded.POOL_MEMORY_USED,
            f"sum by (cluster, pool, model) ({_MEMORY_USED})\n"
            f"/ sum by (cluster, pool, model) ({_MEMORY_TOTAL})",
        ),
    )),
    ("gpufleet-pool-idle-recording", (
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


def _scoped(thresholds: Thresholds, row: AlertRow, comparison: str) -> str:
    """The comparison restricted to the GPUs the row's scope covers."""
    scope = scope_filter(row.scope, thresholds.busy_utilization)
    if scope and "\nor\n" in comparison:  # `and` binds tighter than `or`
        comparison = f"(\n{comparison}\n)"
    return comparison + scope


_TIME_LITERAL = re.compile(r"(\[|offset )((?:\d+(?:ms|[smhdwy]))+)")


def scale_times(text: str, time_scale: float) -> str:
    """Every range window (``[5m]``) and ``offset`` of a rule's PromQL (its expr, or a
    description's query template), scaled by ``time_scale``; the XID window's seconds too.

    With ``for`` scaled the same (``--time-scale``), a run in simulated time sees the
    windows a real one would: a ``[5m]`` at speed 20 spans 5 simulated minutes, not 100.
    """
    if time_scale == 1:
        return text

    def scaled(match: re.Match[str]) -> str:
        return match.group(1) + format_duration(parse_duration(match.group(2)) * time_scale)
    out = _TIME_LITERAL.sub(scaled, text)
    return out.replace(f"< {promql_number(EVENT_WINDOW_SECONDS)}\n",
                       f"< {promql_number(EVENT_WINDOW_SECONDS * time_scale)}\n")


def _absent_exprs(thresholds: Thresholds, row: AlertRow) -> list[str]:
    """One ``absent()`` per job: absent() of a regex selector fires only when every job is
    gone, and without the job label; per job, a job service discovery lost fires on its own.
    Of the plain selector, not of an aggregation around it: ``absent(up{job="x"})`` carries
    ``job="x"``, ``absent(max by (job) (...))`` carries nothing."""
    found = re.search(r'[a-z_:]+\{job=~"\{exporter_jobs\}"\}', row.metric.expr)
    assert found, f"{row.metric.key}: absent_too needs a selector on {{exporter_jobs}}"
    return [found.group(0).replace('job=~"{exporter_jobs}"', f'job="{job}"')
            for job in thresholds.exporter_jobs]


def _alert_rule(thresholds: Thresholds, row: AlertRow, level: Level, expr: str,
                threshold_text: str, for_scale: float) -> dict[str, Any]:
    """One alerting rule. Every alert of every severity is built here, and only here."""
    for_text = format_duration(level.for_seconds * for_scale)
    description = (row.metric.describe
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
                   **dict(row.labels)},
        "annotations": {
            "summary": row.summary,
            "description": f"{description} {row.action}",
            "runbook_url": f"{thresholds.runbook_page}#{row.runbook}",
        },
    }


def _row_rules(thresholds: Thresholds, row: AlertRow, for_scale: float,
               one: str | None = None) -> list[dict[str, Any]]:
    """The row's rules, one per level; with ``one``, those of one value of the metric's
    ``each`` label, which each rule also carries as a label (the value its series have
    already): two rules of one name and the same labels are one rule twice to promtool."""
    rules = _level_rules(thresholds, row, for_scale, one)
    if one is not None and row.metric.each is not None:
        for rule in rules:
            rule["labels"][row.metric.each[0]] = one
    return rules


def _level_rules(thresholds: Thresholds, row: AlertRow, for_scale: float,
                 one: str | None) -> list[dict[str, Any]]:
    value = thresholds.value(row.metric)
    if one is not None:
        value = row.metric.one_value(value, one)
    unit = row.metric.unit
    rules = []
    for level in row.levels:
        if not row.metric.relative_to_tdp:
            comparison = f"{value} {row.op} {promql_number(level.threshold)}"
            if row.metric.absent_too:
                comparison = "\nor\n".join(
                    [comparison, *(f"absent({e})" for e in _absent_exprs(thresholds, row))])
            rules.append(_alert_rule(thresholds, row, level, _scoped(thresholds, row, comparison),
                                     _threshold_text(level.threshold, unit), for_scale))
            continue
        comparison = _power_comparison(row, level, value, row.metric.cap)
        if row.metric.evidence:  # `and` binds tighter than `or`
            comparison = f"(\n{comparison}\n)\nand {GPU_MATCH}\n  {row.metric.evidence}"
        rules.append(_alert_rule(thresholds, row, level, _scoped(thresholds, row, comparison),
                                 _power_threshold_text(row, level), for_scale))
    return rules


def _power_comparison(row: AlertRow, level: Level, value: str, limit: str) -> str:
    """One severity of a per-model row as one expression: models the table gives watts
    against those, every other GPU against the level's fraction of its recorded limit."""
    table = tuple(m for m in row.models if m.from_table)
    parts = []
    for model in table:
        watts = model.threshold(level.severity)
        assert watts is not None  # the loader gives every model every severity
        parts.append(f'{value}{{model="{model.model}"}} {row.op} {promql_number(watts)}')
    names = tuple(m.model for m in table)
    # an exact matcher where one model serves: a regex matcher costs more per series
    selector = (f'{value}{{model!="{names[0]}"}}' if len(names) == 1 else
                f'{value}{{model!~"{regex_alternatives(names)}"}}' if names else value)
    if level.threshold == 1:
        parts.append(f"{selector} {row.op} {GPU_MATCH} group_left () {limit}")
    else:
        # The draw against the level in watts, one join: the comparison keeps the draw (the
        # left side) and its labels. The level as an exact fraction, `limit * 93 / 100`, not
        # `0.93 * limit`: 0.93 * 700 is 651.0000000000001 in floating point, which 651 W
        # never reaches, while 700 * 93 is exact and 65100 / 100 rounds to exactly 651.
        fraction = Fraction(promql_number(level.threshold))
        parts.append(f"{selector} {row.op} {GPU_MATCH} group_left ()\n  "
                     f"({limit} * {fraction.numerator} / {fraction.denominator})")
    return "\nor\n".join(parts)


def _power_threshold_text(row: AlertRow, level: Level) -> str:
    """The level a GPU is compared with, said for its model (a Go template branch per model
    the table gives watts), since one rule now covers every model."""
    fraction = (f"{level.threshold * 100:.10g}% of its power limit (its catalogue TDP where "
                "it reports none)")
    table = [m for m in row.models if m.from_table]
    if not table:
        return fraction
    branches = "".join(
        f'{{{{ {"if" if i == 0 else "else if"} eq {template_label("model")} "{m.model}" }}}}'
        f"{_threshold_text(m.threshold(level.severity) or 0.0, row.metric.unit)}"
        for i, m in enumerate(table))
    return f"{branches}{{{{ else }}}}{fraction}{{{{ end }}}}"


_RANGE = re.compile(r"\[[0-9]")  # a range selector, [5m]: the rule reads every sample of a window
_JOIN = re.compile(r"\bon \(")  # a join with another family, on the GPU's place


def _group_of(row: AlertRow) -> str:
    """The group of a row's rules: one per kind of object, and for GPUs one per row,
    ``gpufleet-gpu-<metric>``, which Prometheus evaluates beside the others. At 10,880 GPUs
    a row that reads a window or joins another per-GPU family costs 0.2-1.0 s of one core
    (issue 45: a window over 21,760 NVLink error series alone reads 457,000 samples), and
    even the comparisons of one family's latest sample cost 0.05-0.2 s each: seven of them
    in one group took 0.6 CPU s, two or three windowed rows in one group 2 s, against the
    goal of 1 s per group."""
    name = _GROUP_OF_SUBJECT[row.metric.subject]
    if name != "gpufleet-gpu":
        return name
    return f"gpufleet-gpu-{row.metric.key.removeprefix('gpu_').replace('_', '-')}"


def _row_groups(thresholds: Thresholds, row: AlertRow,
                for_scale: float) -> list[tuple[str, list[dict[str, Any]]]]:
    """A row's rules with their groups (:func:`_group_of`). A per-GPU row is cut further,
    since one rule that reads a window or joins costs up to 0.5 s alone at 10,880 GPUs: one
    group per value of the metric's ``each`` label (``-crc-flit``, ``-crc-data``: an exact
    matcher each, half the series each), and, for such rules, one per severity where the
    row has two (``-warning``, ``-critical``)."""
    ones: tuple[str | None, ...] = (None,) if row.metric.each is None else row.metric.each[1]
    parts = [(one, _row_rules(thresholds, row, for_scale, one)) for one in ones]
    name = _group_of(row)
    if not name.startswith("gpufleet-gpu-"):
        return [(name, [rule for _, rules in parts for rule in rules])]
    out = []
    for one, rules in parts:
        named = name if one is None else f"{name}-{one.replace('_', '-')}"
        if len(rules) == 1 or not any(_RANGE.search(rule["expr"]) or _JOIN.search(rule["expr"])
                                      for rule in rules):
            out.append((named, rules))  # a comparison of the latest sample: both severities
            continue
        out.extend((f"{named}-{rule['labels']['severity']}", [rule]) for rule in rules)
    return out


def alert_groups(thresholds: Thresholds, for_scale: float = 1.0) -> list[dict[str, Any]]:
    """Alerting rule groups (:func:`_row_groups`), in the table's order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in thresholds.alerts:
        for name, rules in _row_groups(thresholds, row, for_scale):
            groups.setdefault(name, []).extend(rules)
    return [{"name": name, "rules": rules} for name, rules in groups.items()]


def _increase_per_pool(family: str, keep: str, window: str, by: str, selector: str = "") -> str:
    """``increase()`` of a health counter over ``window``, summed ``by`` across pools. Two
    cluster-mode exporters count the same faults and drains: the larger of their counts
    (max by the counter's own labels, ``keep``), never their sum."""
    return f"sum by ({by}) (\n  max by ({keep}) (increase({family}{selector}[{window}]))\n)"


def health_recordings(health: HealthTable) -> tuple[Recording, ...]:
    """Fleet reliability (issue 31, Build 5) from the health families (docs/health.md):
    interruptions by cause over 7 and 30 days, each node's mean time between faults and the
    repeat offenders (at the table's ``health.remediation.replace_after_faults`` faults in its
    ``replace_window``, the node faults' window), and the mean times from fault to drain and
    from drain to resume over 7 days. Plain PromQL, the same on Prometheus and VictoriaMetrics."""
    faults = metrics.HEALTH_FAULTS_TOTAL.name
    node_faults = f"max by (cluster, node, pool) ({metrics.NODE_FAULTS.name})"
    events = metrics.REMEDIATION_EVENTS_TOTAL.name
    window = promql_number(health.remediation.replace_window_seconds)
    replace_at = promql_number(health.remediation.replace_after_faults)

    def mean_per_event(seconds_total: str, action: str) -> str:
        # the seconds are per pool, the events are not: one mean for the cluster, of the
        # events of the 7 days (none in them: no series, rather than 0/0)
        count = _increase_per_pool(events, "cluster, action", "7d", "cluster", f'{{action="{action}"}}')
        return (f"{_increase_per_pool(seconds_total, 'cluster, pool', '7d', 'cluster')}\n/\n"
                f"(\n{count}\n> 0\n)")

    return (
        Recording(recorded.CLUSTER_FAULTS_7D,
                  _increase_per_pool(faults, "cluster, pool, cause", "7d", "cluster, cause")),
        Recording(recorded.CLUSTER_FAULTS_30D,
                  _increase_per_pool(faults, "cluster, pool, cause", "30d", "cluster, cause")),
        # the node's faults counted over the window: its mean time between them
        Recording(recorded.NODE_TIME_BETWEEN_FAULTS, f"{window} / ({node_faults} > 0)"),
        Recording(recorded.NODE_REPEAT_OFFENDER, f"{node_faults} >= {replace_at}"),
        Recording(recorded.CLUSTER_FAULT_TO_DRAIN, mean_per_event(
            metrics.REMEDIATION_FAULT_TO_DRAIN_SECONDS_TOTAL.name, "drain")),
        Recording(recorded.CLUSTER_DRAIN_TO_RESUME, mean_per_event(
            metrics.REMEDIATION_DRAIN_TO_RESUME_SECONDS_TOTAL.name, "resume")),
    )


HEALTH_RECORDING_GROUP = "gpufleet-health-recording"


def recording_groups(thresholds: Thresholds | None = None) -> list[dict[str, Any]]:
    """The fixed groups, plus what the table's load_statistics and pressure sections
    generate (exporter/alerting/pool_load_rules.py) and the health reliability group
    (:func:`health_recordings`) when ``thresholds`` is given."""
    static = [
        {"name": name, "rules": [{"record": r.record, "expr": r.expr} for r in recordings]}
        for name, recordings in RECORDING_GROUPS
    ]
    if thresholds is None:
        return static
    groups = pool_load_rules.recording_groups(thresholds.load_statistics, thresholds.pressure, static)
    if thresholds.health is not None:
        groups.append({"name": HEALTH_RECORDING_GROUP, "rules": [
            {"record": r.record, "expr": r.expr} for r in health_recordings(thresholds.health)]})
    return groups


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


def _header(thresholds: Thresholds, for_scale: float, time_scale: float) -> str:
    lines = [f"# Generated by `gpufleet rules` from {thresholds.source}: edit that table and "
             "run `gpufleet rules`, never this file."]
    if for_scale != 1:
        lines.append(f"# Every `for` is scaled by {for_scale:g} (--for-scale): for tests only.")
    if time_scale != 1:
        lines.append(f"# Every `for`, range window and offset is scaled by {time_scale:g} "
                     "(--time-scale): for simulated time only.")
    return "\n".join(lines) + "\n"


def _scaled_windows(groups: list[dict[str, Any]], time_scale: float) -> list[dict[str, Any]]:
    """The groups with every expr's and annotation's windows scaled (:func:`scale_times`)."""
    if time_scale == 1:
        return groups
    return [{**group, "rules": [
        {key: (scale_times(value, time_scale) if key == "expr" else
               {k: scale_times(v, time_scale) for k, v in value.items()}
               if key == "annotations" else value)
         for key, value in rule.items()}
        for rule in group["rules"]]} for group in groups]


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def generate(thresholds: Thresholds, fmt: str = "prometheus", for_scale: float = 1.0,
             labels: Mapping[str, str] | None = None,
             time_scale: float = 1.0) -> list[GeneratedFile]:
    """The generated files for one format, as text; nothing is written here.

    ``labels`` go on the PrometheusRule object, after gpufleet's own (kube-prometheus-stack
    selects rules by ``release: <its release name>``). ``time_scale`` scales every ``for``,
    range window and offset together, so that rules run in simulated time (a replay at
    speed 20: 0.05) see what they would in real time; ``for_scale`` scales ``for`` alone.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    _positive("for_scale", for_scale)
    _positive("time_scale", time_scale)
    header = _header(thresholds, for_scale, time_scale)
    alerts = _scaled_windows(alert_groups(thresholds, for_scale * time_scale), time_scale)
    recordings = _scaled_windows(recording_groups(thresholds), time_scale)
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
    "scale_times",
]
