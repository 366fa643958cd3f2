"""The analyzer's metric families, and the live analyzer the server runs on every snapshot.

:func:`report_families` is a pure table from a :class:`~.index.Report` to
families; :class:`LiveAnalyzer` keeps the one piece of state the analysis
needs between snapshots (the live workload window) and is registered as a
``ServingState.family_providers`` entry, so the families are rendered with
the snapshot they describe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from exporter import metrics
from exporter.analysis import configure
from exporter.analysis.fgd import FRAGMENT_REASONS, CompiledWorkload, compile_workload
from exporter.analysis.index import IndexSettings, Report, evaluate
from exporter.analysis.options import AnalysisConfig
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import ShapeWindow, Workload
from exporter.load.live import LoadTracker
from exporter.metrics import Family
from exporter.snapshot import FleetSnapshot
from exporter.thresholds import Thresholds

log = logging.getLogger(__name__)


def _value(x: float) -> float:
    # sums of weighted shares carry float noise (0.30000000000000004); 1e-9 GPU is noise
    return round(float(x), 9)


def report_families(report: Report) -> list[Family]:
    cluster = report.cluster
    workload = report.workload.workload
    pool_labels = [(("model", p.model), ("pool", p.name)) for p in report.pools]
    return [
        metrics.CLUSTER_FRAGMENTATION_INDEX.family([((), _value(cluster.index))]),
        metrics.CLUSTER_TIER_INVERSION_PENALTY.family([((), _value(cluster.penalty))]),
        metrics.CLUSTER_FRAGMENTED_GPUS.family([((), _value(cluster.fragmented_gpus))]),
        metrics.CLUSTER_IDLE_GPUS.family([((), _value(cluster.idle_gpus))]),
        metrics.CLUSTER_FRAGMENTATION_RATIO.family([((), _value(cluster.fragmentation_ratio))]),
        metrics.CLUSTER_FRAGMENTED_GPUS_BY_REASON.family(
            [((("reason", r),), _value(cluster.breakdown.get(r, 0.0))) for r in FRAGMENT_REASONS]),
        metrics.POOL_FRAGMENTATION_INDEX.family(
            [(labels, _value(p.index)) for labels, p in zip(pool_labels, report.pools, strict=True)]),
        metrics.POOL_TIER_INVERSION_PENALTY.family(
            [(labels, _value(p.penalty)) for labels, p in zip(pool_labels, report.pools, strict=True)]),
        metrics.POOL_FRAGMENTED_GPUS.family(
            [(labels, _value(p.fragmented_gpus))
             for labels, p in zip(pool_labels, report.pools, strict=True)]),
        metrics.POOL_IDLE_GPUS.family(
            [(labels, _value(p.idle_gpus))
             for labels, p in zip(pool_labels, report.pools, strict=True)]),
        metrics.NODE_FRAGMENTED_GPUS.family(
            [((("node", name),), _value(f)) for name, f in
             zip(report.state.names, report.totals.node_fragmented, strict=True)]),
        metrics.TIER_INVERSION.family(
            [((("lower", inv.lower), ("upper", inv.upper)), float(inv.inverted))
             for inv in report.inversions]),
        metrics.FRAGMENTATION_WORKLOAD_SHAPES.family([((), float(len(workload)))]),
        metrics.FRAGMENTATION_WORKLOAD_COVERAGE_RATIO.family([((), _value(workload.coverage))]),
        metrics.FRAGMENTATION_WORKLOAD_CPU_ONLY_RATIO.family([((), _value(workload.cpu_only_share))]),
        metrics.FRAGMENTATION_WORKLOAD_INFO.family(
            [((("cpu_only", "included" if workload.include_cpu_only else "excluded"),
               ("source", workload.source)), 1.0)]),
    ]


@dataclass
class LiveAnalyzer:
    """Measures every served snapshot against the live (or configured) target workload."""

    settings: IndexSettings
    window: ShapeWindow | None = None  # the live workload; None when it is fixed
    fixed: Workload | None = None
    latest: Report | None = None  # for the advisor: the report of the last snapshot
    _analyzed: FleetSnapshot | None = None  # the snapshot ``latest`` belongs to
    _compiled: CompiledWorkload | None = None
    # pool load, change points and scaling hints (issue 20), over the same window of snapshots
    load: LoadTracker | None = None

    @classmethod
    def from_config(cls, config: AnalysisConfig, table: Thresholds | None = None) -> LiveAnalyzer:
        """``table``: the threshold table in force (configure.index_settings)."""
        fixed = configure.fixed_workload(config)
        window = configure.shape_window(config) if fixed is None else None
        return cls(configure.index_settings(config, table), window, fixed,
                   load=LoadTracker.from_table(config.window_snapshots, table))

    def analyze(self, snapshot: FleetSnapshot) -> Report:
        if self.window is not None:
            self.window.observe(snapshot)
            workload = self.window.workload()
        else:
            assert self.fixed is not None
            workload = self.fixed
        state = from_snapshot(snapshot)
        compiled = self._compiled
        if compiled is None or compiled.workload != workload or compiled.model_names != state.model_names:
            compiled = compile_workload(workload, state.model_names)
            self._compiled = compiled
        report = evaluate(state, compiled, self.settings)
        if self.load is not None:
            self.load.observe(snapshot)
        self.latest = report
        self._analyzed = snapshot
        return report

    def current_workload(self) -> Workload:
        """The workload the last snapshot was measured against (what-if analyses reuse it)."""
        if self.fixed is not None:
            return self.fixed
        assert self.window is not None
        return self.window.workload()

    def families(self, snapshot: FleetSnapshot) -> list[Family]:
        """A ``ServingState.family_providers`` entry: called once per snapshot, in a worker thread.

        When the analyzer already saw this snapshot as a listener (so the advisor
        could use the report), its report is rendered rather than recomputed.
        """
        report = self.latest if self._analyzed is snapshot and self.latest is not None \
            else self.analyze(snapshot)
        return report_families(report) + (self.load.families() if self.load is not None else [])
