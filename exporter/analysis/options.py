"""Options of the analysis (the ``analysis:`` section of the config), declared beside the
analysis as each source's options are beside its source: :mod:`exporter.config` assembles
them, and the analysis reads them without importing the config module (which imports the
source registry, and through the sim source the simulator and placement, which import
the analysis: a package cycle)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import opt as _opt
from exporter.thresholds import load_thresholds
from exporter.thresholds.defaults import FromTable

ANALYSIS_WORKLOADS = ("window", "trace", "shapes")


def table_compaction_threshold() -> float:
    """The default of ``analysis.compaction_threshold`` and ``advisor.trigger``: the level of
    the threshold table's fragmentation row, so the analyzer, the advisor and the alert that
    routes to it act at one index (:meth:`Thresholds.compaction_threshold`). Marked as a
    default (exporter/thresholds/defaults.py), so ``serve`` follows its ``thresholds_file``."""
    return FromTable(load_thresholds().compaction_threshold())


@dataclass(frozen=True)
class ShapeConfig:
    cpus: float = _opt(0.0, help="CPU cores the task asks for on one node.", min=0)
    gpus: int = _opt(1, help="GPUs it asks for on one node; 0 is a CPU-only task.", min=0, max=64)
    gpu_share: float = _opt(
        1.0, help="Share of each of those GPUs: 1.0 a whole GPU, 0.5 half of one.", min=0, max=1
    )
    models: tuple[str, ...] = _opt((), help="GPU models (catalogue names) it may use; empty: any.")
    weight: float = _opt(1.0, help="How often it occurs; weights are renormalised.", min=0)


@dataclass(frozen=True)
class TierPenaltyConfig:
    penalty: float = _opt(30.0, help="Index points added per inverted pair of tiers.", min=0)
    idle_at_most: float = _opt(
        0.0, help="The higher tier counts as idle at or below this allocated share.", min=0, max=1
    )
    busy_above: float = _opt(
        0.5, help="The lower tier counts as busy above this allocated share.", min=0, max=1
    )


@dataclass(frozen=True)
class AnalysisConfig:
    enabled: bool = _opt(True, help="Export the fragmentation analysis with every snapshot.")
    workload: str = _opt(
        "window", help="Target workload: shapes of live allocations over a window of snapshots, "
        "an openb pod trace, or the shapes listed here.", choices=ANALYSIS_WORKLOADS,
    )
    window_snapshots: int = _opt(60, help="Snapshots the live workload window spans.", min=1)
    trace: str = _opt("", help="openb pod CSV defining the workload (workload: trace).")
    shapes: tuple[ShapeConfig, ...] = _opt((), help="Task shapes (workload: shapes).")
    coverage: float = _opt(
        0.95, help="Keep the most common shapes until they cover this share of tasks.",
        exclusive_min=0, max=1,
    )
    include_cpu_only: bool = _opt(True, help="Count CPU-only tasks in the target workload.")
    slack_nodes: float = _opt(
        1.0, help="Slack S of the index, in GPUs of the widest node in the pool.", min=0
    )
    tier_penalty: TierPenaltyConfig = _opt(
        help="Penalty when a higher GPU tier idles while a lower one is busy.",
        factory=TierPenaltyConfig,
    )
    compaction_threshold: float = _opt(
        help="Compaction is due when the cluster index exceeds this; default: the threshold "
        "table's fragmentation level (thresholds_file), followed when it is reloaded.",
        factory=table_compaction_threshold, min=0, max=100,
    )
