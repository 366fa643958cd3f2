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

from exporter.analysis import configure
from exporter.analysis.fgd import FRAGMENT_REASONS, CompiledWorkload, compile_workload
from exporter.analysis.index import IndexSettings, Report, evaluate
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import ShapeWindow, Workload
from exporter.config import AnalysisConfig
from exporter.exposition import Family
from exporter.snapshot import FleetSnapshot

log = logging.getLogger(__name__)


def _value(x: float) -> float:
    # sums of weighted shares carry float noise (0.30000000000000004); 1e-9 GPU is noise
    return round(float(x), 9)


def report_families(report: Report) -> list[Family]:
    cluster = report.cluster
    workload = report.workload.workload
    pool_labels = [(("model", p.model), ("pool", p.name)) for p in report.pools]
    return [
        Family("gpufleet_cluster_fragmentation_index", "gauge",
               "FGD fragmentation index of the cluster, 0-100: 100 * fragmented / (idle + one "
               "node of slack), plus tier-inversion penalties.",
               [((), _value(cluster.index))]),
        Family("gpufleet_cluster_fragmented_gpus", "gauge",
               "Idle GPUs (in GPU shares) the target workload cannot use, weighted by how often "
               "each task shape occurs (FGD).",
               [((), _value(cluster.fragmented_gpus))]),
        Family("gpufleet_cluster_idle_gpus", "gauge",
               "Unallocated GPU capacity of the cluster in GPUs (free shares summed).",
               [((), _value(cluster.idle_gpus))]),
        Family("gpufleet_cluster_fragmentation_ratio", "gauge",
               "Fragmented GPUs over idle GPUs (0-1).",
               [((), _value(cluster.fragmentation_ratio))]),
        Family("gpufleet_cluster_fragmented_gpus_by_reason", "gauge",
               "Fragmented GPUs by why the workload cannot use them: lacks_gpu, lacks_cpu, "
               "lacks_both, no_access (GPU model), cpu_only.",
               [((("reason", r),), _value(cluster.breakdown.get(r, 0.0))) for r in FRAGMENT_REASONS]),
        Family("gpufleet_pool_fragmentation_index", "gauge",
               "FGD fragmentation index of the pool, 0-100, plus tier-inversion penalties when "
               "the pool is an idle higher tier.",
               [(labels, _value(p.index)) for labels, p in zip(pool_labels, report.pools, strict=True)]),
        Family("gpufleet_pool_fragmented_gpus", "gauge",
               "Idle GPUs of the pool the target workload cannot use (FGD).",
               [(labels, _value(p.fragmented_gpus))
                for labels, p in zip(pool_labels, report.pools, strict=True)]),
        Family("gpufleet_pool_idle_gpus", "gauge",
               "Unallocated GPU capacity of the pool in GPUs (free shares summed).",
               [(labels, _value(p.idle_gpus))
                for labels, p in zip(pool_labels, report.pools, strict=True)]),
        Family("gpufleet_node_fragmented_gpus", "gauge",
               "Idle GPUs of the node the target workload cannot use (FGD).",
               [((("node", name),), _value(f)) for name, f in
                zip(report.state.names, report.totals.node_fragmented, strict=True)]),
        Family("gpufleet_tier_inversion", "gauge",
               "1 while the higher-tier pool is idle and the lower-tier pool busy, else 0.",
               [((("lower", inv.lower), ("upper", inv.upper)), float(inv.inverted))
                for inv in report.inversions]),
        Family("gpufleet_fragmentation_workload_shapes", "gauge",
               "Task shapes in the target workload fragmentation is measured against.",
               [((), float(len(workload)))]),
        Family("gpufleet_fragmentation_workload_coverage_ratio", "gauge",
               "Share of observed tasks the target workload's shapes cover (0-1).",
               [((), _value(workload.coverage))]),
        Family("gpufleet_fragmentation_workload_cpu_only_ratio", "gauge",
               "Weight of CPU-only shapes in the target workload (0-1).",
               [((), _value(workload.cpu_only_share))]),
        Family("gpufleet_fragmentation_workload_info", "gauge",
               "Where the target workload comes from and whether CPU-only tasks count; always 1.",
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

    @classmethod
    def from_config(cls, config: AnalysisConfig) -> LiveAnalyzer:
        fixed = configure.fixed_workload(config)
        window = configure.shape_window(config) if fixed is None else None
        return cls(configure.index_settings(config), window, fixed)

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
        if self._analyzed is snapshot and self.latest is not None:
            return report_families(self.latest)
        return report_families(self.analyze(snapshot))
