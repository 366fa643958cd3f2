"""The ``analysis:`` config section turned into index settings and a target workload."""

from __future__ import annotations

from exporter.analysis import openb
from exporter.analysis.index import IndexSettings
from exporter.analysis.options import AnalysisConfig
from exporter.analysis.workload import Shape, ShapeWindow, Workload, from_tasks, from_weighted
from exporter.errors import ConfigError
from exporter.gpu_catalogue import Catalogue, default_catalogue
from exporter.thresholds import Thresholds
from exporter.thresholds.defaults import follows_table


def index_settings(config: AnalysisConfig, table: Thresholds | None = None) -> IndexSettings:
    """The index settings of the ``analysis`` section; ``compaction_threshold`` left at its
    default is read from ``table`` when given (the table ``serve`` runs on, and each reload
    of it: exporter/thresholds/defaults.py)."""
    tiers = config.tier_penalty
    threshold = config.compaction_threshold
    if table is not None and follows_table(threshold):
        threshold = table.compaction_threshold()
    return IndexSettings(
        slack_nodes=config.slack_nodes,
        tier_penalty=tiers.penalty,
        idle_at_most=tiers.idle_at_most,
        busy_above=tiers.busy_above,
        compaction_threshold=threshold,
    )


def configured_shapes(config: AnalysisConfig, catalogue: Catalogue | None = None) -> Workload:
    """The workload listed under ``analysis.shapes``, model names resolved through the catalogue."""
    catalogue = catalogue or default_catalogue()
    if not config.shapes:
        raise ConfigError("analysis.shapes: list at least one shape when analysis.workload is shapes")
    pairs = [
        (Shape(s.cpus, s.gpu_share, s.gpus, tuple(catalogue.resolve(m) for m in s.models)), s.weight)
        for s in config.shapes
    ]
    if sum(w for _, w in pairs) <= 0:
        raise ConfigError("analysis.shapes: at least one shape needs a weight above 0")
    return from_weighted(pairs, include_cpu_only=config.include_cpu_only)


def trace_workload(path: str, config: AnalysisConfig, key: str = "analysis.trace") -> Workload:
    """The typical workload of an openb pod CSV, or of a named trace (``openb-default``).

    A bad file or name is a one-line ConfigError.
    """
    if not path:
        raise ConfigError(f"{key}: give an openb pod CSV or a trace name ({openb.DEFAULT_TRACE}) "
                          "when analysis.workload is trace")
    try:
        # a bare name such as openb-gpuspec33 (no folder, no extension) is a named trace
        if path.startswith("openb-") and "/" not in path and "." not in path:
            path = str(openb.named_trace(path).pods)
        pods = openb.load_pods(path)
    except openb.OpenbError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return from_tasks((p.shape for p in pods), coverage=config.coverage,
                      include_cpu_only=config.include_cpu_only)


def fixed_workload(config: AnalysisConfig) -> Workload | None:
    """The configured workload, or None when it is the live window (built from snapshots)."""
    if config.workload == "trace":
        return trace_workload(config.trace, config)
    if config.workload == "shapes":
        return configured_shapes(config)
    return None


def shape_window(config: AnalysisConfig) -> ShapeWindow:
    return ShapeWindow(config.window_snapshots, config.coverage, config.include_cpu_only)
