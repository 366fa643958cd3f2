"""The threshold table, ``rules/thresholds.yaml``: loaded once, validated strictly.

The table is the only place a threshold, a ``for`` duration, a summary or an
action is written, and :func:`load_thresholds` the only code that opens it
(``tests/test_imports.py`` checks that no other module names the file). Alerting
and recording rules, dashboards, the advisor, the config's defaults, scaling and
``gpufleet load`` all read the typed :class:`Thresholds` it returns, so a gauge
that turns red means an alert fires.

Each row names a metric from :data:`METRICS` (the table's vocabulary,
:mod:`exporter.thresholds.table_metrics`: in which unit, about which object, compared how,
with which PromQL) and gives its warning and critical levels. Power is per GPU model: the levels are fractions
of each model's TDP from the GPU catalogue unless the row names the model in
``models`` with watts of its own.

Anything wrong (an unknown metric or key, warning and critical in the wrong
order, a malformed duration, a model the catalogue lacks) raises
:class:`ThresholdError`, one line naming the file and the key. Values are checked by the
one validator's file checks (:mod:`exporter.validate`), with the config's wording; the
loader puts the file's name in front. Nothing is generated from a table that does not load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from exporter import validate
from exporter.errors import ConfigError, one_line, quoted
from exporter.gpu_catalogue import Catalogue, default_catalogue
from exporter.thresholds.health import HealthTable, parse_health, provide_installed
from exporter.thresholds.scaling import ScalingTable, parse_scaling
from exporter.thresholds.sections import LoadStatistics, Pressure, parse_sections
from exporter.thresholds.table_metrics import (
    METRICS,
    TableMetric,
    scope_filter,
    with_matchers,
)
from exporter.yamlfile import parse_mapping, read_text

PACKAGED_TABLE = "thresholds.yaml"  # in exporter/: see _packaged_table
CHECKOUT_TABLE = Path("rules") / "thresholds.yaml"  # what `gpufleet rules` reads in a checkout
COMPACTION_METRIC = "pool_fragmentation_index"  # its row's level is the compaction threshold
CHECKPOINT_METRIC = "job_checkpoint_age"  # its row's level is 2 x advisor.checkpoint_interval
CHECKPOINT_INTERVALS_STALE = 2  # a checkpoint older than this many intervals is stale (issue 17)
DEFAULT_CHECKPOINT_INTERVAL = 900.0  # the reference cluster's 15 min, for a table without the row
SEVERITIES = ("warning", "critical")  # in rising order; both share one alert name
DEPLOYMENTS = ("node", "cluster")  # the modes gpufleet runs in, each scraped by its own job
OPS = ("<", ">", ">=", "==")


class ThresholdError(ConfigError):
    """The threshold table is wrong; the message names the file, the row and the key."""


SCOPES: dict[str, str] = {
    "all": "every series of the metric",
    "allocated": "only GPUs held by a job (an idle, unallocated GPU is capacity, not waste)",
    "busy": "only busy GPUs (utilization above busy_utilization)",
    "busy_multi_gpu": "only busy GPUs of jobs that hold more than one GPU",
}

# (min, max) accepted per unit; ratios may be written as percentages ("30%")
_RANGES = {"ratio": (0.0, 1.0), "celsius": (0.0, 200.0), "watts": (0.0, 10_000.0),
           "index": (0.0, 100.0), "state": (0.0, 1.0), "count": (0.0, 1e9),
           "seconds": (0.0, 366 * 86400.0)}
_TDP_FRACTION_RANGE = (0.0, 1.5)

_ALERT_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_ANCHOR = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True, slots=True)
class Level:
    """One severity of a row: fire when the value compares with ``threshold`` for ``for``."""

    severity: str
    threshold: float  # in the metric's unit; a fraction of TDP for per-model metrics
    for_seconds: float


@dataclass(frozen=True, slots=True)
class ModelThreshold:
    """Absolute thresholds of a per-model metric (power, in watts) for one GPU model."""

    model: str
    levels: tuple[tuple[str, float], ...]  # (severity, threshold) in SEVERITIES order
    from_table: bool  # True: the table names the model; False: fraction of the catalogue TDP

    def threshold(self, severity: str) -> float | None:
        return dict(self.levels).get(severity)


@dataclass(frozen=True, slots=True)
class AlertRow:
    """One condition of the table: one alert name, a warning and/or a critical level."""

    alert: str
    metric: TableMetric
    op: str
    scope: str
    levels: tuple[Level, ...]  # warning before critical
    summary: str
    action: str
    runbook: str  # anchor of the alert's section in docs/runbooks.md
    owner: str  # who acts on it (docs/alerting.md, docs/runbooks.md)
    page: bool = False  # True: the critical level pages; every other level is a ticket
    labels: tuple[tuple[str, str], ...] = ()
    models: tuple[ModelThreshold, ...] = ()  # per-model metrics: every model with thresholds
    # while it fires, Alertmanager mutes every paging alert of the same node (an inhibit rule
    # generated from the table: exporter/alerting/inhibit.py)
    mutes_pages: bool = False

    @property
    def severities(self) -> tuple[str, ...]:
        return tuple(level.severity for level in self.levels)

    def level(self, severity: str) -> Level | None:
        return next((lv for lv in self.levels if lv.severity == severity), None)

    def threshold(self, severity: str, model: str | None = None) -> float | None:
        """The threshold in the metric's unit (what a dashboard colours at).

        For a per-model metric, give the model to get its absolute value (watts);
        without one, or for a model with no thresholds, this is the fraction of
        the model's TDP, or of its enforced power limit when the catalogue has none.
        """
        if model is not None:
            for entry in self.models:
                if entry.model == model:
                    return entry.threshold(severity)
        level = self.level(severity)
        return level.threshold if level else None


@dataclass(frozen=True, slots=True)
class Thresholds:
    source: str  # file name, for messages and the generated files' header
    runbook_base_url: str  # docs/runbooks.md as operators reach it; anchors are appended
    exporter_jobs: tuple[str, ...]  # the Prometheus jobs that scrape gpufleet (docs/deploy.md)
    busy_utilization: float  # a GPU above this utilization counts as busy (NVLink rule)
    critical_xids: tuple[tuple[int, str], ...]  # (XID, what it means) that page
    alerts: tuple[AlertRow, ...]
    # issue 20, exporter/thresholds/sections.py; None: the table has no such section
    load_statistics: LoadStatistics | None = None
    pressure: Pressure | None = None
    scaling: ScalingTable | None = None  # issue 20, exporter/thresholds/scaling.py
    # gpufleet's own address as the pager's reader reaches it (http://gpufleet.example:9874);
    # `gpufleet serve` serves the runbooks at <external_url>/runbooks
    external_url: str | None = None
    # issue 31, exporter/thresholds/health.py: every setting of the health verdicts,
    # remediation and stragglers (a table without the section has the installed table's)
    health: HealthTable | None = None
    # (mode, job) for each of exporter_jobs when the table names them by mode
    # ({node: gpufleet-nodes, cluster: gpufleet-cluster}); empty for a plain list
    exporter_job_modes: tuple[tuple[str, str], ...] = ()

    @property
    def runbook_page(self) -> str:
        """The runbooks page each alert's ``runbook_url`` points into (anchors appended).

        A notification is read in a pager or a chat, far from any checkout, so the link
        must be absolute once the site says where: ``runbook_base_url`` if it is an
        absolute URL (a wiki), else ``external_url``'s ``/runbooks`` (served by gpufleet
        itself), else the relative default, which resolves only beside these docs.
        """
        if _ABSOLUTE_URL.match(self.runbook_base_url) or self.external_url is None:
            return self.runbook_base_url
        return f"{self.external_url.rstrip('/')}/runbooks"

    def for_deployment(self, mode: str) -> Thresholds:
        """This table for a deployment that runs only ``mode`` (node or cluster): its rules
        watch that mode's scrape job alone, so the job of a mode that is not run never pages
        (GpufleetJobDown fires on a job with no target at all)."""
        if mode not in DEPLOYMENTS:
            raise ThresholdError(f"deployment: must be one of {', '.join(DEPLOYMENTS)}, "
                                 f"got {quoted(mode)}")
        if not self.exporter_job_modes:
            raise ThresholdError(
                f"{self.source}: exporter_jobs is a plain list, which says no job's mode: "
                "name them by mode ({node: gpufleet-nodes, cluster: gpufleet-cluster}) or "
                "list only the jobs you run")
        jobs = tuple((m, job) for m, job in self.exporter_job_modes if m == mode)
        if not jobs:
            raise ThresholdError(f"{self.source}: exporter_jobs names no {mode} job")
        return replace(self, exporter_jobs=tuple(job for _, job in jobs),
                       exporter_job_modes=jobs)

    def alert(self, name: str) -> AlertRow:
        for row in self.alerts:
            if row.alert == name:
                return row
        raise KeyError(name)

    def row(self, metric: str) -> AlertRow | None:
        """The (first) row comparing ``metric``, by its key; None if the table has none."""
        return next((row for row in self.alerts if row.metric.key == metric), None)

    def value(self, metric: TableMetric) -> str:
        """``metric``'s PromQL with this table's exporter jobs and critical XIDs filled in."""
        return metric.filled(self.exporter_jobs, tuple(code for code, _ in self.critical_xids))

    def panel_query(self, metric: TableMetric, selector: str = "") -> str:
        """What a panel coloured at the levels of ``metric``'s row plots: the value that row's
        alert compares with them (restricted to its scope), over the series ``selector``
        (the panel's variables) picks. So a panel that turns a colour shows exactly where
        the alert with those levels would fire."""
        row = self.row(metric.key)
        scope = scope_filter(row.scope, self.busy_utilization) if row is not None else ""
        return with_matchers(self.value(metric) + scope, selector)

    def compaction_threshold(self) -> float:
        """The fragmentation index above which compaction is due: the lowest level of the row
        comparing ``pool_fragmentation_index``, whose alert Alertmanager routes to the advisor.

        ``analysis.compaction_threshold`` and ``advisor.trigger`` default to it, so the
        analyzer, the advisor and the alert act at one index.
        """
        row = self.row(COMPACTION_METRIC)
        if row is not None:
            return row.levels[0].threshold  # warning (or the only level): the lower one
        raise ThresholdError(f"{self.source}: no alert row compares {COMPACTION_METRIC}; the "
                             "compaction threshold (analysis.compaction_threshold, "
                             "advisor.trigger) comes from it")

    def checkpoint_interval(self) -> float:
        """How often jobs checkpoint, in seconds: the lowest level of the row comparing
        ``job_checkpoint_age`` (GpuJobCheckpointStale, "older than 2 x the interval") divided
        by :data:`CHECKPOINT_INTERVALS_STALE`, so that the alert and the advisor's cost of a
        move (``advisor.checkpoint_interval``'s default) read one number. A table without
        that row gives the reference cluster's 15 min.
        """
        row = self.row(CHECKPOINT_METRIC)
        if row is not None:
            return row.levels[0].threshold / CHECKPOINT_INTERVALS_STALE
        return DEFAULT_CHECKPOINT_INTERVAL


_TOP_KEYS = ("exporter_jobs", "busy_utilization", "critical_xids", "alerts")
_OPTIONAL_TOP_KEYS = ("runbook_base_url", "external_url", "load_statistics", "pressure",
                      "scaling", "health")
# Relative: it resolves where the alert is read beside this repository's docs (a checkout, the
# GitHub or GitLab page of a site's fork); a site sets its own wiki's page
DEFAULT_RUNBOOK_BASE_URL = "docs/runbooks.md"
_ABSOLUTE_URL = re.compile(r"^https?://[^/\s]+")
_URL_TEXT = re.compile(r"[^\s#\"'<>{}|\\^`]+")  # one URL or path, without an #anchor or space
_ROW_KEYS = ("alert", "metric", "op", "scope", "warning", "critical", "models", "labels",
             "summary", "action", "runbook", "owner", "page", "mutes_pages")
OWNERS = ("on-call", "job owner", "platform team", "capacity planner")
_LEVEL_KEYS = ("threshold", "for")


def parse_thresholds(text: str, source: str = "thresholds.yaml",
                     catalogue: Catalogue | None = None, *, installed: bool = False) -> Thresholds:
    """Validate the table's text into :class:`Thresholds`; :class:`ThresholdError` if wrong.

    ``installed``: this is the table installed with gpufleet, whose ``health`` section holds
    every default and so must name every key (another table's missing keys are read from it).
    """
    catalogue = catalogue or default_catalogue()
    raw = parse_mapping(text, source, ThresholdError)
    try:
        return _parse(raw, Path(source).name, catalogue, installed)
    except ThresholdError:  # the installed table's own, naming its file
        raise
    except ConfigError as exc:  # the one validator's (exporter/validate.py): the key, what is wrong
        raise ThresholdError(one_line(f"{source}: {exc}")) from None  # keys come from the file


def _parse(raw: Any, file_name: str, catalogue: Catalogue, installed: bool) -> Thresholds:
    if isinstance(raw, dict) and "runbook_url" in raw:
        raise ConfigError("runbook_url: renamed runbook_base_url: the runbooks page your "
                          "operators reach, without an #anchor (default docs/runbooks.md)")
    top = validate.mapping(raw, "top level", _TOP_KEYS + _OPTIONAL_TOP_KEYS, required=_TOP_KEYS)
    runbook_base_url = validate.line(top.get("runbook_base_url", DEFAULT_RUNBOOK_BASE_URL),
                              "runbook_base_url")
    if "#" in runbook_base_url:
        raise ConfigError("runbook_base_url: must be the page without an #anchor; rows give the "
                          "anchor")
    if not _URL_TEXT.fullmatch(runbook_base_url) or len(runbook_base_url) > 512:
        raise ConfigError(f"runbook_base_url: must be one URL or path of at most 512 characters, "
                          f"without spaces or quotes, got {quoted(runbook_base_url)}")
    external_url = None
    if "external_url" in top:
        external_url = validate.line(top["external_url"], "external_url")
        if not _ABSOLUTE_URL.match(external_url) or not _URL_TEXT.fullmatch(external_url) \
                or len(external_url) > 512:
            raise ConfigError("external_url: must be gpufleet's absolute http(s) URL as operators "
                              f"reach it, without an #anchor, got {quoted(external_url)}")
    exporter_job_modes = _job_modes(top["exporter_jobs"])
    exporter_jobs = (tuple(job for _, job in exporter_job_modes) if exporter_job_modes
                     else _jobs(top["exporter_jobs"]))
    busy = validate.quantity(top["busy_utilization"], "busy_utilization", "ratio", _RANGES["ratio"],
                             percent=True)
    xids = _xids(top["critical_xids"])
    if not isinstance(top["alerts"], list) or not top["alerts"]:
        raise ConfigError("alerts: must be a non-empty list of alert rows")
    rows: list[AlertRow] = []
    for index, raw_row in enumerate(top["alerts"]):
        name = raw_row.get("alert") if isinstance(raw_row, dict) else None
        # the name helps find the row, but only a valid one: "0\n" would break the line
        named = isinstance(name, str) and _ALERT_NAME.fullmatch(name) is not None
        where = f"alerts[{index}]" + (f" ({name})" if named else "")
        row = _parse_row(raw_row, where, catalogue)
        if any(existing.alert == row.alert for existing in rows):
            raise ConfigError(f"{where}.alert: {row.alert} appears twice; one row per alert name")
        rows.append(row)
    statistics, pressure = parse_sections(top, tuple((row.alert, row.metric.key) for row in rows))
    scaling = parse_scaling(top["scaling"]) if "scaling" in top else None
    health = parse_health(top.get("health"), tuple(code for code, _ in xids),
                          None if installed else _installed_health)
    return Thresholds(file_name, runbook_base_url, exporter_jobs, busy, xids, tuple(rows),
                      statistics, pressure, scaling, external_url, health, exporter_job_modes)


def _installed_health() -> HealthTable:
    health = load_thresholds().health
    assert health is not None  # parse_thresholds always sets it
    return health


def _installed_xids() -> tuple[int, ...]:
    return tuple(code for code, _ in load_thresholds().critical_xids)


# the health settings' defaults are the installed table's rows (exporter/thresholds/health.py)
provide_installed(_installed_health, _installed_xids)


def _xids(value: Any) -> tuple[tuple[int, str], ...]:
    """XID codes that page, each with what it means (the runbook and the docs repeat it)."""
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"critical_xids: must be a mapping of XID numbers to what they mean, "
                          f"got {quoted(value)}")
    out = []
    for code, meaning in value.items():
        if not isinstance(code, int) or isinstance(code, bool) or not 1 <= code <= 1000:
            raise ConfigError(f"critical_xids.{code}: must be an XID number between 1 and 1000")
        out.append((code, validate.line(meaning, f"critical_xids.{code}")))
    return tuple(sorted(out))


def _jobs(value: Any) -> tuple[str, ...]:
    """The scrape jobs GpufleetTargetDown watches, each a name PromQL quotes as it is."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"exporter_jobs: must be a non-empty list of job names or a mapping "
                          f"of modes ({', '.join(DEPLOYMENTS)}) to job names, got {quoted(value)}")
    jobs: list[str] = []
    for index, raw in enumerate(value):
        where = f"exporter_jobs[{index}]"
        job = _job(raw, where)
        if job in jobs:
            raise ConfigError(f"{where}: {job} appears twice")
        jobs.append(job)
    return tuple(jobs)


def _job_modes(value: Any) -> tuple[tuple[str, str], ...]:
    """``exporter_jobs`` by mode, ``{node: gpufleet-nodes, cluster: gpufleet-cluster}``, in
    :data:`DEPLOYMENTS`' order; empty when the table gives a plain list (:func:`_jobs`)."""
    if not isinstance(value, dict):
        return ()
    modes = validate.mapping(value, "exporter_jobs", DEPLOYMENTS)
    if not modes:
        raise ConfigError(f"exporter_jobs: must name the job of at least one mode "
                          f"({', '.join(DEPLOYMENTS)})")
    found: list[tuple[str, str]] = []
    for mode in DEPLOYMENTS:
        if mode in modes:
            job = _job(modes[mode], f"exporter_jobs.{mode}")
            for other_mode, other in found:
                if job == other:
                    raise ConfigError(f"exporter_jobs.{mode}: {job} is the {other_mode} job "
                                      "too; each mode has its own scrape job")
            found.append((mode, job))
    return tuple(found)


def _job(raw: Any, where: str) -> str:
    job = validate.line(raw, where)
    if '"' in job or "\\" in job or " " in job:
        raise ConfigError(f"{where}: must be a plain job name, got {quoted(job)}")
    return job


def load_thresholds(path: str | Path | None = None,
                    catalogue: Catalogue | None = None) -> Thresholds:
    """Read and validate the threshold table at ``path``; without one, the table installed
    with gpufleet (the defaults that come from it), read once per process.

    The only function that opens a threshold table. A path (``--thresholds FILE``, a
    reload) is read every call: only the packaged default is cached.
    """
    if path is None:
        return _packaged_table() if catalogue is None else _read_packaged(catalogue)
    return _read(path, catalogue)


def _read(path: str | Path, catalogue: Catalogue | None, installed: bool = False) -> Thresholds:
    return parse_thresholds(read_text(path, "the threshold table", ThresholdError), str(path),
                            catalogue, installed=installed)


def _read_packaged(catalogue: Catalogue | None) -> Thresholds:
    with resources.as_file(resources.files("exporter").joinpath(PACKAGED_TABLE)) as path:
        return _read(path, catalogue, installed=True)


@cache
def _packaged_table() -> Thresholds:
    """The table installed with gpufleet.

    ``exporter/thresholds.yaml`` is package data and a link to ``rules/thresholds.yaml``,
    the one copy anyone edits: in a checkout it is that file, and ``pip install`` (wheel
    or sdist) copies its content, so an installed exporter has it without a checkout.
    Read once per process (about 15 ms with the GPU catalogue it checks against).
    """
    return _read_packaged(None)


def _parse_row(raw: Any, where: str, catalogue: Catalogue) -> AlertRow:
    row = validate.mapping(raw, where, _ROW_KEYS,
                           required=("alert", "metric", "op", "summary", "action"))
    alert = validate.line(row["alert"], f"{where}.alert")
    if not _ALERT_NAME.match(alert):
        raise ConfigError(f"{where}.alert: must be a CamelCase alert name, got {quoted(alert)}")
    metric_key = row["metric"]
    if not isinstance(metric_key, str) or metric_key not in METRICS:
        raise ConfigError(f"{where}.metric: unknown metric {quoted(metric_key)} "
                          f"(known: {', '.join(METRICS)})")
    metric = METRICS[metric_key]
    op = row["op"]
    if not isinstance(op, str) or op not in metric.ops:
        raise ConfigError(f"{where}.op: must be one of {' '.join(metric.ops)} for {metric.key}, "
                          f"got {quoted(op)}")
    scope = row.get("scope", "all")
    if not isinstance(scope, str) or scope not in SCOPES:
        raise ConfigError(f"{where}.scope: must be one of {', '.join(SCOPES)}, got {quoted(scope)}")
    if scope != "all" and metric.subject != "gpu":
        raise ConfigError(f"{where}.scope: {scope} applies to per-GPU metrics only, "
                          f"not {metric.key}")
    levels = []
    for severity in SEVERITIES:
        if severity not in row:
            continue
        key = f"{where}.{severity}"
        level = validate.mapping(row[severity], key, _LEVEL_KEYS, required=_LEVEL_KEYS)
        threshold = _threshold(level["threshold"], f"{key}.threshold", metric)
        levels.append(Level(severity, threshold, validate.duration(level["for"], f"{key}.for")))
    if not levels:
        raise ConfigError(f"{where}: needs a warning or a critical level (or both)")
    _check_order(where, op, [(lv.severity, lv.threshold) for lv in levels], "threshold")
    if op == "==" and len(levels) == 2:
        if levels[0].threshold != levels[1].threshold:
            raise ConfigError(f"{where}: warning and critical of an == condition must compare "
                              "with the same value and differ by for")
        if levels[1].for_seconds <= levels[0].for_seconds:
            raise ConfigError(f"{where}.critical.for: must be longer than warning.for for an == "
                              "condition (critical is the longer outage)")
    models = _models(row.get("models"), where, metric, op, levels, catalogue)
    labels = _labels(row.get("labels", {}), f"{where}.labels")
    page = row.get("page", False)
    if not isinstance(page, bool):
        raise ConfigError(f"{where}.page: must be true or false, got {quoted(page)}")
    if page and not any(lv.severity == "critical" for lv in levels):
        raise ConfigError(f"{where}.page: only a critical level pages: add one, or page: false")
    owner = row.get("owner")
    if owner not in OWNERS:
        raise ConfigError(f"{where}.owner: must say who acts, one of {', '.join(OWNERS)}; "
                          f"got {quoted(owner)}")
    mutes_pages = row.get("mutes_pages", False)
    if not isinstance(mutes_pages, bool):
        raise ConfigError(f"{where}.mutes_pages: must be true or false, got {quoted(mutes_pages)}")
    if mutes_pages and "by (cluster, node" not in metric.expr:  # its alerts carry `node`
        raise ConfigError(f"{where}.mutes_pages: only a per-node alert (one with a node label) "
                          f"mutes its node's pages, not {metric.key}")
    runbook = row.get("runbook", alert.lower())
    if not isinstance(runbook, str) or not _ANCHOR.match(runbook):
        raise ConfigError(f"{where}.runbook: must be a lower-case anchor such as "
                          f"{alert.lower()}, got {quoted(runbook)}")
    return AlertRow(
        alert=alert, metric=metric, op=op, scope=scope, levels=tuple(levels),
        summary=validate.line(row["summary"], f"{where}.summary"),
        action=validate.line(row["action"], f"{where}.action"),
        runbook=runbook, owner=owner, page=page, labels=labels, models=models,
        mutes_pages=mutes_pages,
    )


def _threshold(value: Any, where: str, metric: TableMetric) -> float:
    if metric.relative_to_tdp:
        return validate.quantity(value, where, "fraction of the model's TDP", _TDP_FRACTION_RANGE,
                                 percent=True)
    if metric.unit == "seconds" and isinstance(value, str):  # 30m reads better than 1800
        seconds = validate.duration(value, where)
        low, high = _RANGES["seconds"]
        if not low <= seconds <= high:
            raise ConfigError(f"{where}: must be between {low:g} and {high:g} seconds, "
                              f"got {quoted(value)}")
        return seconds
    return validate.quantity(value, where, metric.unit, _RANGES[metric.unit],
                             percent=metric.unit == "ratio")


def _check_order(where: str, op: str, values: list[tuple[str, float]],
                 what: str) -> None:
    """Critical must be the more extreme level: below warning for <, above it for > and >=."""
    found = dict(values)
    if "warning" not in found or "critical" not in found or op == "==":
        return
    warning, critical = found["warning"], found["critical"]
    if op == "<" and not critical < warning:
        raise ConfigError(f"{where}: critical {what} ({critical:g}) must be below warning {what} "
                          f"({warning:g}) for {op}: warning and critical are in the wrong order")
    if op in (">", ">=") and not critical > warning:
        raise ConfigError(f"{where}: critical {what} ({critical:g}) must be above warning {what} "
                          f"({warning:g}) for {op}: warning and critical are in the wrong order")


def _models(raw: Any, where: str, metric: TableMetric, op: str,
            levels: list[Level], catalogue: Catalogue) -> tuple[ModelThreshold, ...]:
    """Absolute per-model thresholds: the table's own, else fractions of the catalogue TDP."""
    if not metric.relative_to_tdp:
        if raw is not None:
            raise ConfigError(f"{where}.models: only per-model metrics take models, "
                              f"not {metric.key}")
        return ()
    overrides = {} if raw is None else raw
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}.models: must be a mapping of GPU models to thresholds, "
                          f"got {quoted(overrides)}")
    severities = tuple(lv.severity for lv in levels)
    known = catalogue.names()
    table: dict[str, tuple[tuple[str, float], ...]] = {}
    for model, values in overrides.items():
        key = f"{where}.models.{model}"
        if model not in known:
            raise ConfigError(f"{key}: model {quoted(model)} is not in the GPU catalogue "
                              f"(known: {', '.join(known)})")
        given = validate.mapping(values, key, severities, required=severities)
        bounds = _RANGES[metric.unit]
        pairs = tuple((s, validate.quantity(given[s], f"{key}.{s}", metric.unit, bounds))
                      for s in severities)
        _check_order(key, op, list(pairs), f"{metric.unit} threshold")
        table[model] = pairs
    out = []
    for spec in catalogue.models:  # catalogue order: the generated rules follow it
        if spec.name in table:
            out.append(ModelThreshold(spec.name, table[spec.name], from_table=True))
        elif spec.tdp_watts:
            pairs = tuple((lv.severity, round(lv.threshold * spec.tdp_watts, 3)) for lv in levels)
            out.append(ModelThreshold(spec.name, pairs, from_table=False))
    return tuple(out)


def _labels(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of label names to values, "
                          f"got {quoted(raw)}")
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name):
            raise ConfigError(f"{where}.{name}: not a valid Prometheus label name")
        if name in ("severity", "alertname", "page"):
            raise ConfigError(f"{where}.{name}: is set by the generator; remove it")
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}.{name}: must be a non-empty string, got {quoted(value)}")
        out.append((name, value))
    return tuple(out)


__all__ = [
    "CHECKPOINT_INTERVALS_STALE",
    "CHECKPOINT_METRIC",
    "COMPACTION_METRIC",
    "METRICS",
    "OPS",
    "OWNERS",
    "SCOPES",
    "SEVERITIES",
    "AlertRow",
    "Level",
    "ModelThreshold",
    "TableMetric",
    "ThresholdError",
    "Thresholds",
    "load_thresholds",
    "parse_thresholds",
]


def command_table(given: str | None) -> tuple[Thresholds, Path | None]:
    """The table ``gpufleet rules`` and ``gpufleet dashboards`` read, and its folder.

    ``--thresholds FILE`` if given; else ``rules/thresholds.yaml`` in the current folder
    (a checkout, where the table is edited); else the table installed with gpufleet, so
    both commands work after ``pip install`` and in the image. That one's folder is
    ``None``: the installed package is no place to write generated files.
    """
    if given is not None:
        return load_thresholds(given), Path(given).parent
    if CHECKOUT_TABLE.is_file():
        return load_thresholds(CHECKOUT_TABLE), CHECKOUT_TABLE.parent
    return load_thresholds(), None
