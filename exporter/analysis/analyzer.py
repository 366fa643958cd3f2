"""The analyzer's metric families, and the live analyzer the cycle runs on every snapshot.

:func:`report_families` is a pure table from a :class:`~.index.Report` to
families; :class:`LiveAnalyzer` keeps the one piece of state the analysis
needs between snapshots (the live workload window).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter import metrics
from exporter.analysis import configure
from exporter.analysis.fgd import FRAGMENT_REASONS, CompiledWorkload, compile_workload, reweight
from exporter.analysis.index import IndexSettings, KeptScorer, Report, evaluate
from exporter.analysis.options import AnalysisConfig
from exporter.analysis.state import FleetState, from_snapshot
from exporter.analysis.workload import Shape, ShapeWindow, Workload
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


class FleetView(NamedTuple):
    """What the caller already holds of a snapshot (the simulator's placer): its placement
    state, and its allocations' shapes (:func:`~exporter.analysis.workload.snapshot_shapes`'
    counts, in its order), or None to count them from the snapshot."""

    state: FleetState
    shapes: Counter[Shape] | None = None


@dataclass
class LiveAnalyzer:
    """Measures every served snapshot against the live (or configured) target workload: the
    cycle's analysis stage (exporter/cycle/stages.py) holds one."""

    settings: IndexSettings
    window: ShapeWindow | None = None  # the live workload; None when it is fixed
    fixed: Workload | None = None
    _compiled: CompiledWorkload | None = None
    _scorer: KeptScorer = field(default_factory=KeptScorer, repr=False)

    @classmethod
    def from_config(cls, config: AnalysisConfig, table: Thresholds | None = None) -> LiveAnalyzer:
        """``table``: the threshold table in force (configure.index_settings)."""
        fixed = configure.fixed_workload(config)
        window = configure.shape_window(config) if fixed is None else None
        return cls(configure.index_settings(config, table), window, fixed)

    def analyze(self, snapshot: FleetSnapshot, view: FleetView | None = None) -> Report:
        """The snapshot's report; the live window observes it first. ``view``: its state and
        shapes when the caller holds them (they must be what ``from_snapshot`` and
        ``snapshot_shapes`` would make of it)."""
        if self.window is not None:
            if view is None or view.shapes is None:
                self.window.observe(snapshot)
            else:
                self.window.observe_shapes(view.shapes)
            workload = self.window.workload()
        else:
            assert self.fixed is not None
            workload = self.fixed
        state = from_snapshot(snapshot) if view is None else view.state
        compiled = self._compiled
        if (compiled is None or compiled.model_names != state.model_names
                or compiled.workload.shapes != workload.shapes):
            compiled = self._compiled = compile_workload(workload, state.model_names)
        elif compiled.workload != workload:  # a live window's weights moved: most snapshots
            compiled = self._compiled = reweight(compiled, workload)
        return evaluate(state, compiled, self.settings, kept=self._scorer)

    def current_workload(self) -> Workload:
        """The workload the last snapshot was measured against (what-if analyses reuse it)."""
        if self.fixed is not None:
            return self.fixed
        assert self.window is not None
        return self.window.workload()


__all__ = ["FleetView", "LiveAnalyzer", "report_families"]
