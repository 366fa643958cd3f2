"""One YAML config, validated into frozen dataclasses at start.

Every field has a default, so an empty file (or none) is a valid config.
Validation is strict: an unknown key, a wrong type or an out-of-range value
raises :class:`ConfigError` whose message names the dotted key and what is
allowed. The CLI prints it on one line and exits 2, with no traceback.

The compaction threshold (``analysis.compaction_threshold`` and ``advisor.trigger``)
is written once, in the threshold table's fragmentation row (rules/thresholds.yaml,
installed as package data): the defaults are read from the table the first time a
config is built. An install missing the table fails then, on one line naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from exporter.analysis.options import AnalysisConfig, table_compaction_threshold
from exporter.durations import parse_duration
from exporter.errors import ConfigError, quoted
from exporter.options import Duration
from exporter.options import opt as _opt
from exporter.sources import SOURCES
from exporter.thresholds import load_thresholds
from exporter.thresholds.defaults import (
    CLEAR_HYSTERESIS,
    DurationFromTable,
    FromTable,
    clear_below_for,
    follows_table,
)
from exporter.validate import Builder, one_of, text, true_or_false
from exporter.yamlfile import load_mapping

DEFAULT_PORT = 9874  # 9400 is dcgm-exporter's and 9835 nvidia_gpu_exporter's
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


@dataclass(frozen=True)
class LogConfig:
    level: str = _opt("info", help="Log level.", choices=("debug", "info", "warning", "error"))
    format: str = _opt("logfmt", help="Log line format.", choices=("logfmt", "json"))


def _sources_config() -> type:
    """``sources``: one field per registered source (:data:`exporter.sources.SOURCES`), whose
    type is the options dataclass the source declares beside its code."""
    fields = []
    for name, entry in SOURCES.items():
        options = entry.options_class()
        fields.append((name, options, _opt(help=entry.help, factory=options)))
    assembled = dataclasses.make_dataclass("SourcesConfig", fields, frozen=True)
    assembled.__module__ = __name__
    return assembled


if TYPE_CHECKING:
    SourcesConfig = Any  # its fields are the registered sources' names
else:
    SourcesConfig = _sources_config()


def _table_checkpoint_interval() -> Duration:
    """The default of ``advisor.checkpoint_interval``: half the threshold table's
    GpuJobCheckpointStale level ("older than 2 x the interval"), so the alert and the cost
    of a move read one number (:meth:`Thresholds.checkpoint_interval`). Marked as a default
    (exporter/thresholds/defaults.py): ``serve`` reads it from ``thresholds_file`` instead."""
    return DurationFromTable(load_thresholds().checkpoint_interval())


def _table_clear_below() -> float:
    """The default of ``advisor.clear_below``: below the trigger by the hysteresis
    (:func:`clear_below_for`), recomputed from whichever trigger is in force, so a table at
    any legal level never makes the default clear bound meet the trigger."""
    return FromTable(clear_below_for(table_compaction_threshold()))


@dataclass(frozen=True)
class ReceiverConfig:
    name: str = _opt(help="Receiver name, used in metrics and the outbox.")
    url: str = _opt(help="URL the plan is POSTed to.", url=True)
    secret_file: str = _opt("", help="File holding the HMAC secret (else secret_env).")
    secret_env: str = _opt("GPUFLEET_WEBHOOK_SECRET",
                           help="Environment variable holding the HMAC secret.")
    timeout: Duration = _opt(Duration(10), help="Per-request timeout.", exclusive_min=0)


def _health_default(name: str) -> Duration:
    """The default of an ``advisor.health`` duration: the threshold table's row of the same
    name (``health.verdicts.clean_window``, ``health.remediation.min_drain``), so code, table
    and config hold one number. Marked as a default (exporter/thresholds/defaults.py):
    ``serve`` reads it from ``thresholds_file`` instead, and again on each reload."""
    health = load_thresholds().health
    assert health is not None  # the installed table has every health row
    part = health.verdicts if name == "clean_window_seconds" else health.remediation
    return DurationFromTable(getattr(part, name))


@dataclass(frozen=True)
class HealthConfig:
    """The two durations of health remediation a site may set here (docs/health.md); each
    overrides the threshold table's row of the same name, which every other setting is."""

    clean_window: Duration = _opt(
        help="A failing or degraded GPU's verdict falls only after this long without its "
        "signal (a resume waits for it); default: the threshold table's "
        "health.verdicts.clean_window (thresholds_file), followed when it is reloaded.",
        factory=lambda: _health_default("clean_window_seconds"), min=0)
    min_drain: Duration = _opt(
        help="A node gpufleet drained stays drained at least this long, so a flapping GPU "
        "does not cycle it; default: the threshold table's health.remediation.min_drain, "
        "followed when it is reloaded.", factory=lambda: _health_default("min_drain_seconds"),
        min=0)


@dataclass(frozen=True)
class AdvisorConfig:
    enabled: bool = _opt(True, help="Run the rebalancing advisor (needs analysis.enabled).")
    token_file: str = _opt("", help="File holding the bearer token for POSTs; the "
                           "GPUFLEET_ADVISOR_TOKEN environment variable wins when set.")
    max_body_bytes: int = _opt(16 * 1024 * 1024, help="Largest POST body accepted.", min=1024)
    outbox: str = _opt("gpufleet-outbox.sqlite", help="SQLite file of pending webhook deliveries.")
    outbox_retention: Duration = _opt(Duration(7 * 86400), help="How long delivered, rejected and "
                                      "expired deliveries stay in the outbox before they are "
                                      "deleted.", exclusive_min=0)
    receivers: tuple[ReceiverConfig, ...] = _opt((), help="Schedulers the plans are POSTed to.")
    retry_initial: Duration = _opt(Duration(1), help="First retry delay.", exclusive_min=0)
    retry_max: Duration = _opt(Duration(300), help="Longest retry delay.", exclusive_min=0)
    trigger: float = _opt(help="Index above which compaction is considered; default: the threshold "
                          "table's fragmentation level (thresholds_file), followed when it is "
                          "reloaded.", factory=table_compaction_threshold, min=0, max=100)
    clear_below: float = _opt(help="Index below which the recommendation clears; default: "
                              f"the trigger less {CLEAR_HYSTERESIS:g} points (at most half "
                              "the trigger), following it.", factory=_table_clear_below,
                              min=0, max=100)
    dwell: Duration = _opt(Duration(600), help="How long the index must stay above trigger.", min=0)
    cooldown: Duration = _opt(Duration(1800), help="Least time between two plans.", min=0)
    plan_ttl: Duration = _opt(Duration(900), help="How long a plan stays valid.", exclusive_min=0)
    min_recovered_per_migration: float = _opt(
        0.5, help="Gate: fragmented GPUs a plan must recover per migration.", min=0)
    min_nodes_freed_per_migration: float = _opt(
        0.0, help="Gate: whole nodes a plan must free per migration.", min=0)
    require_pending: bool = _opt(
        True, help="Where the snapshot says what waits (pending jobs listed, or a Slurm or "
        "Kubernetes source up), plan only for the job at the queue's head that fragments "
        "block, never for the index (the revised rule, docs/simulate.md); false: the index "
        "rule alone, compaction once the index stays above trigger, whether or not a job waits.")
    rule: str = _opt("queue", help="Which pending jobs a plan is made for: queue, the queue's head "
                     "and then the next blocked jobs the moves left in the budget start, each where "
                     "the waiting it ends pays the work its moves cost, the plan refused when the "
                     "jobs it leaves no room for have waited more than it saves; head, the head "
                     "alone (the rule before; docs/simulate.md); starts and horizon, as queue, refusing a "
                     "plan that costs the small jobs more starts (before the next plan) or waiting "
                     "(while its head runs) than it saves.",
                     choices=("queue", "head", "starts", "horizon", "horizon-room"))
    hold_recheck: Duration = _opt(Duration(60), help="After a hold (nothing worth moving), how "
                                  "long snapshots wait before planning again; alerts re-plan at once.",
                                  min=0)
    max_migrations: int = _opt(10, help="Budget: migrations per plan.", min=1)
    max_migrations_per_node: int = _opt(4, help="Budget: migrations off one node per plan.", min=1)
    max_migrations_per_namespace: int = _opt(5, help="Budget: migrations of one namespace per plan.",
                                             min=1)
    move_high_priority: bool = _opt(False, help="Allow moving high-priority jobs.")
    high_priority: int = _opt(1000, help="Jobs at or above this priority are high-priority.")
    min_runtime: Duration = _opt(Duration(1800), help="Jobs younger than this are not disturbed yet.",
                                 min=0)
    checkpoint_interval: Duration = _opt(
        help="How often jobs checkpoint, for the cost of a move; default: half the threshold "
        "table's GpuJobCheckpointStale level (15 min in the shipped table; thresholds_file).",
        factory=_table_checkpoint_interval,
        exclusive_min=0)
    assume_checkpointing: bool = _opt(True, help="A job that states no last checkpoint is taken "
                                      "to checkpoint every checkpoint_interval (a move costs at "
                                      "most that much work); false: it never does (a move costs "
                                      "its whole runtime).")
    health: HealthConfig = _opt(help="GPU health verdicts and remediation (docs/health.md).",
                                factory=HealthConfig)

    def check(self, prefix: str) -> None:
        # only a clear bound set by hand can meet the trigger: the default follows it. One
        # set against the table's trigger is checked again with the table serve runs on
        # (advise.decision_settings)
        if not follows_table(self.clear_below) and self.clear_below >= self.trigger:
            raise ConfigError(f"{prefix}.clear_below: must be below {prefix}.trigger "
                              f"({self.clear_below:g} >= {self.trigger:g})")
        names = [r.name for r in self.receivers]
        if len(set(names)) != len(names):
            raise ConfigError(f"{prefix}.receivers: names must be unique")


@dataclass(frozen=True)
class WebConfig:
    """Connection limits of the HTTP server (exporter/web/connection_gate.py says why each exists)."""

    max_connections: int = _opt(
        1000, help="Open connections at most, lowered to (ulimit -n - 256) / 2. A new one "
        "beyond it closes the longest-waiting connection with no request in progress, else "
        "it is closed at once.", min=1,
    )
    header_timeout: Duration = _opt(
        Duration(5), help="Complete request headers must arrive within this of a connection's "
        "opening, or of the first byte of a later request on it.", exclusive_min=0,
    )
    body_timeout: Duration = _opt(
        Duration(10), help="A request body must have arrived whole within this of its headers, "
        "else 408 and the connection closed (a body sent a byte at a time held a connection "
        "and a request slot without end).", exclusive_min=0,
    )
    keepalive_timeout: Duration = _opt(
        Duration(75), help="An idle keep-alive connection is closed after this; longer than "
        "Prometheus' default 1m scrape interval, so a scraper reuses its connection.",
        exclusive_min=0,
    )
    max_requests: int = _opt(
        40, help="Requests in flight per endpoint; more are answered 503 at once; 0: no limit "
        "(node_exporter's --web.max-requests).", min=0,
    )
    config_file: str = _opt(
        "", help="node_exporter's web config file (TLS, basic auth, headers; exporter-toolkit "
        "format), read again when it changes or on SIGHUP; --web.config.file wins.",
    )
    shutdown_grace: Duration = _opt(
        Duration(10), help="On SIGTERM or SIGINT, new connections are refused and responses "
        "in flight get this long to finish before the process exits; the default is "
        "Prometheus' default scrape_timeout, inside the shipped units' 30 s stop timeouts.",
        min=0,
    )
    stall_intervals: int = _opt(
        3, help="/-/ready answers 503 when the last collection finished more than this many "
        "collect_intervals ago (never less than source_timeout plus one collect_interval, "
        "the longest a collection may take by design).", min=1,
    )


@dataclass(frozen=True)
class ApiConfig:
    require_token_for_reads: bool | None = _opt(
        None, help="GET /v1/* (not /v1/openapi.json) needs the advisor's bearer token; "
        "default (null): on when a web config file is set.",
    )
    what_if_timeout: Duration = _opt(
        Duration(10), help="Time limit of one POST /v1/plan what-if (one runs at a time; "
        "the next gets 503 until it ends). Past it the request gets 503; the work cannot be "
        "stopped and holds the slot until it ends.", exclusive_min=0, max=300,
    )


@dataclass(frozen=True)
class ExpositionConfig:
    """Which families /metrics serves (exporter/exposition/options.py, ExpositionOptions)."""

    per_gpu: str = _opt(
        "auto", help="Serve the per-GPU and per-node telemetry. auto: on, off when the "
        "prometheus source is enabled (cluster mode: the node exporters serve it; a second "
        "copy would double every count).", choices=("auto", "true", "false"), bool_as_text=True,
    )


MAX_CLUSTER_CHARS = 128


@dataclass(frozen=True)
class Config:
    listen: str = _opt(DEFAULT_LISTEN, help="HOST:PORT to serve on.")
    thresholds_file: str = _opt(
        "", help="The threshold table (rules/thresholds.yaml's format) whose levels the "
        "advisor and the analysis default to; read again on SIGHUP and when it changes (a "
        "table that fails to load keeps the last good one); empty: the table installed with "
        "gpufleet. --thresholds wins.",
    )
    cluster: str = _opt("", help="Value of a `cluster` label on every series served, so one "
                        "Prometheus (or Thanos) can hold several clusters; empty: no label.")
    collect_interval: Duration = _opt(
        Duration(5), help="How often sources are read; never inside a scrape.", exclusive_min=0
    )
    source_timeout: Duration = _opt(
        Duration(10), help="Longest a source read may take before it counts as failed.",
        exclusive_min=0,
    )
    gzip_level: int = _opt(5, help="gzip level for the pre-compressed /metrics body (zlib's 1-9; "
                           "with ISA-L, the default, 1-6 is its 1, 7-8 its 2, 9 its 3).",
                           min=1, max=9)
    log: LogConfig = _opt(help="Logging.", factory=LogConfig)
    web: WebConfig = _opt(help="HTTP connection limits, TLS and authentication.", factory=WebConfig)
    api: ApiConfig = _opt(help="The JSON API under /v1.", factory=ApiConfig)
    sources: SourcesConfig = _opt(help="Sources and their options.", factory=SourcesConfig)
    analysis: AnalysisConfig = _opt(help="Fragmentation analysis.", factory=AnalysisConfig)
    advisor: AdvisorConfig = _opt(help="Rebalancing advisor.", factory=AdvisorConfig)
    exposition: ExpositionConfig = _opt(help="What /metrics serves.", factory=ExpositionConfig)

    def check(self, prefix: str) -> None:
        # a label value may hold anything, but a newline or a 10 kB value is a mistake
        if len(self.cluster) > MAX_CLUSTER_CHARS or not self.cluster.isprintable():
            raise ConfigError(f"cluster: must be at most {MAX_CLUSTER_CHARS} printable "
                              f"characters, got {quoted(self.cluster)}")
        # the dcgm read ends by its per-target deadline; at or past source_timeout the
        # collector cancels the whole read first, and every target, the good ones too, is lost
        dcgm = getattr(self.sources, "dcgm", None)
        if dcgm is not None and dcgm.enabled and dcgm.timeout >= self.source_timeout:
            raise ConfigError(f"sources.dcgm.timeout: must be below source_timeout "
                              f"({dcgm.timeout:g}s >= {self.source_timeout:g}s)")
        # the same for the first read of the apiserver's lists: cancelled by the collector
        # first, it would fail every start on a cluster whose lists take longer
        kube = getattr(self.sources, "kubernetes", None)
        if kube is not None and kube.enabled and kube.sync_timeout >= self.source_timeout:
            raise ConfigError(f"sources.kubernetes.sync_timeout: must be below source_timeout "
                              f"({kube.sync_timeout:g}s >= {self.source_timeout:g}s)")
        # and for the kubelet's calls in node mode: cancelled with the read, they would take
        # the GPUs' fresh values with them
        nvml = getattr(self.sources, "nvml", None)
        if (nvml is not None and nvml.enabled and nvml.pod_resources
                and nvml.pod_resources_timeout >= self.source_timeout):
            raise ConfigError(f"sources.nvml.pod_resources_timeout: must be below source_timeout "
                              f"({nvml.pod_resources_timeout:g}s >= {self.source_timeout:g}s)")


def _leaf(tp: Any, value: Any, key: str, meta: Mapping[str, Any]) -> Any:
    """A value that is no record, list or optional (exporter.validate.Builder walks those):
    checked as its type and the field's rules (exporter.options.opt) say."""
    if tp is Duration:
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite duration, got {quoted(value)}")
        try:
            result: Any = Duration(parse_duration(value, config=True))
        except ValueError as exc:
            raise ConfigError(f"{key}: must be {exc}, got {quoted(value)}") from None
    elif tp is bool:
        result = true_or_false(value, key)
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {quoted(value)}")
        result = value
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number, got {quoted(value)}")
        if not math.isfinite(value):  # NaN passes every min and max: nan < 0 is False
            raise ConfigError(f"{key}: must be a finite number, got {quoted(value)}")
        result = float(value)
    elif tp is str:
        if isinstance(value, bool) and meta.get("bool_as_text"):  # per_gpu: true | false | auto
            value = "true" if value else "false"
        result = text(value, key)
    else:  # pragma: no cover - a schema bug, not a user error
        raise TypeError(f"unsupported config type {tp} at {key}")
    _check_range(result, key, meta)
    if tp is Duration and result < 0:  # the field's own rule says more; without one, still
        raise ConfigError(f"{key}: must be >= 0, got {quoted(value)}")
    return result


def _check_range(value: Any, key: str, meta: Mapping[str, Any]) -> None:
    if "choices" in meta:
        one_of(value, key, meta["choices"])
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{key}: must be >= {meta['min']}, got {quoted(value)}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{key}: must be <= {meta['max']}, got {quoted(value)}")
    if "exclusive_min" in meta and value <= meta["exclusive_min"]:
        raise ConfigError(f"{key}: must be > {meta['exclusive_min']}, got {quoted(value)}")
    if "url" in meta:
        _check_url(value, key, bare=meta["url"] == "host:port")


_URL_HINT = {False: "an http(s) URL with a host", True: "host:port or an http(s) URL"}


def _check_url(value: str, key: str, bare: bool) -> None:
    """``url=True``: ``http(s)://host[:port][/path]``; ``url="host:port"`` also takes the bare
    ``host:port`` (a dcgm target). No whitespace or control character anywhere: urlsplit
    keeps them, and aiohttp would fail at the first read instead of at start."""
    text = f"http://{value}" if bare and "://" not in value else value
    try:
        parts = urlsplit(text)  # ValueError: "http://[::1" (an unclosed IPv6 address)
        port_ok = parts.port is not None or not parts.netloc.rpartition("@")[2].endswith(":")
    except ValueError:  # or "host:port" with a port that is no number in 0-65535
        parts, port_ok = urlsplit(""), False
    if (parts.scheme not in ("http", "https") or not parts.hostname or not port_ok
            or any(c.isspace() or not c.isprintable() for c in value)):
        shown = _USERINFO.sub(r"\1", value)  # an error goes to logs: no password in it
        raise ConfigError(f"{key}: must be {_URL_HINT[bare]}, got {quoted(shown)}")


_USERINFO = re.compile(r"(://)[^/@]*@")


_BUILDER = Builder(_leaf, ConfigError, run_checks=True)


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a YAML mapping, naming the dotted key of any error; a
    built object's ``check(prefix)`` then checks the rules between its fields."""
    return _BUILDER.build(cls, data, prefix)


def load(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    return build(Config, load_mapping(path, "config file", ConfigError, empty_ok=True))


def describe(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per option with its default and help, for ``gpufleet serve --help``."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            lines.append(f"  {key}: {f.metadata.get('help', '')}")
            lines += describe(tp, key)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()  # e.g. the threshold table's compaction level
        else:
            default = None
        if isinstance(default, tuple):
            shown = "[...]" if default else "[]"
        elif f.default is None:  # an optional value, e.g. api.require_token_for_reads
            shown = "null"
        else:
            shown = "(required)" if default is None else repr(default)
        allowed = f"; one of {', '.join(f.metadata['choices'])}" if "choices" in f.metadata else ""
        lines.append(f"  {key} = {shown}: {f.metadata.get('help', '')}{allowed}")
    return lines
