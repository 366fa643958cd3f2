"""The stages of the cycle, in the order it runs them: table, analysis, load, health, advisor.

Each holds its own state between cycles (the table in force, the live workload window, the
pools' load windows, the verdicts and remediation, the advisor's dwell and cooldown) and is
run by :func:`exporter.cycle.run_cycle` only. None of them writes to the durable store or
sends anything: that is :mod:`exporter.cycle.effects`' work, driven by the frame.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.cycle.frame import Frame

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from exporter.advisor.advice import Advice
    from exporter.advisor.advise import PlanFunction, Steerer
    from exporter.advisor.engine import Advisor
    from exporter.analysis.analyzer import FleetView, LiveAnalyzer
    from exporter.health.monitor import HealthMonitor
    from exporter.metrics import Family
    from exporter.pool_load.tracker import LoadTracker
    from exporter.preemption.advice import PreemptionAdvice
    from exporter.snapshot import FleetSnapshot
    from exporter.thresholds.reloading import LiveThresholds


@dataclass
class TableStage:
    """The threshold table as it is on disk now: looked at once per cycle (one ``stat()``),
    first, so every later stage judges the snapshot by the same table."""

    live: LiveThresholds
    name: str = "table"

    def step(self, frame: Frame) -> Frame:
        if self.live.path is not None:
            self.live.poll()
        return dataclasses.replace(frame, table=self.live.current)

    def families(self, frame: Frame) -> list[Family]:
        return self.live.families(frame.snapshot)


@dataclass
class AnalysisStage:
    """Fragmentation (FGD) of the snapshot against the live workload window.

    ``fleet_view``: where the fleet's placement state and shapes come from when the caller
    already holds them (the simulator's placer); None: built from the snapshot."""

    analyzer: LiveAnalyzer
    fleet_view: Callable[[FleetSnapshot], FleetView] | None = None
    name: str = "analysis"

    def step(self, frame: Frame) -> Frame:
        view = None if self.fleet_view is None else self.fleet_view(frame.snapshot)
        return dataclasses.replace(frame, report=self.analyzer.analyze(frame.snapshot, view))

    def families(self, frame: Frame) -> list[Family]:
        from exporter.analysis.analyzer import report_families

        return [] if frame.report is None else report_families(frame.report)


@dataclass
class LoadStage:
    """The pools' load over the window, their change points and scaling hints."""

    tracker: LoadTracker
    name: str = "load"

    def step(self, frame: Frame) -> Frame:
        self.tracker.observe(frame.snapshot)
        return dataclasses.replace(frame, load=tuple(self.tracker.advice()))

    def families(self, frame: Frame) -> list[Family]:
        return self.tracker.families()


@dataclass
class HealthStage:
    """Verdicts per GPU and node, the remediation they call for, stragglers: on every
    snapshot, whether or not the advisor runs."""

    monitor: HealthMonitor
    name: str = "health"

    def step(self, frame: Frame) -> Frame:
        return dataclasses.replace(frame, health=self.monitor.observe(frame.snapshot))

    def families(self, frame: Frame) -> list[Family]:
        return self.monitor.families()


@dataclass
class AdvisorStage:
    """The advisor's evaluation of the snapshot: the engine decides, the planner plans.

    An Alertmanager notification evaluates the last frame again between cycles
    (:meth:`evaluate_last`); ``lock`` keeps that and the cycle's evaluation apart."""

    advisor: Advisor
    planner: PlanFunction
    load: LoadTracker | None = None  # the pools' scaling hints ride along in the advice
    name: str = "advisor"
    lock: threading.Lock = field(default_factory=threading.Lock)
    last: Frame | None = None  # the last frame evaluated, for an Alertmanager notification
    steerer: Steerer | None = None  # the placement preferences the advice carries; None: off
    preemption: Callable[[FleetSnapshot], PreemptionAdvice] | None = None  # victims and spot quota

    def step(self, frame: Frame) -> Frame:
        if frame.report is None:
            return frame
        return dataclasses.replace(frame, advice=self.evaluate(frame, "snapshot"))

    def evaluate(self, frame: Frame, trigger: str) -> Advice:
        """One evaluation of ``frame`` (blocking: the planner is CPU work)."""
        from exporter.advisor.advise import advise

        assert frame.report is not None
        with self.lock:
            scaling = None if self.load is None else tuple(self.load.advice())
            self.last = frame
            steering = None
            if self.steerer is not None:
                try:
                    steering = self.steerer(frame.report, self.advisor.clock(), frame.snapshot.taken_at)
                except Exception:  # a hint: its fault must not cost the advice itself
                    log.exception("steering not computed for this evaluation")
            advice = advise(self.advisor, frame.snapshot, frame.report, self.planner, trigger, scaling,
                            steering=steering)
            if self.preemption is not None:
                try:
                    # the engine's advice is what /v1/advice serves: it carries the section too
                    advice = self.advisor.advice = dataclasses.replace(
                        advice, preemption=self.preemption(frame.snapshot))
                except Exception:  # advice beside the plan: its fault must not cost the plan
                    log.exception("preemption advice not computed for this evaluation")
            return advice

    def evaluate_last(self, trigger: str) -> Advice | None:
        """The last frame evaluated again (an Alertmanager notification); None before any,
        and while the snapshots are blind."""
        last = self.last
        return None if last is None else self.evaluate(last, trigger)

    def skipped(self, frame: Frame) -> None:
        """A blind frame, not evaluated: the last frame seen is not the fleet now, so an
        Alertmanager notification must not evaluate it again as if it were."""
        with self.lock:
            self.last = None
            if self.steerer is not None:  # nor are its weights: computed afresh once it sees again
                self.steerer.last = None

    def families(self, frame: Frame) -> list[Family]:
        return []  # the advisor's families read its deliveries too: AdvisorService.families


__all__ = ["AdvisorStage", "AnalysisStage", "HealthStage", "LoadStage", "TableStage"]
