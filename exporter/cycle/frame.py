"""The frame one cycle makes of one snapshot, the stage contract, and the cycle itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: the frame module loads no stage's package
    from exporter.advisor.advice import Advice
    from exporter.analysis.index import Report
    from exporter.health.monitor import HealthView
    from exporter.metrics import Family
    from exporter.pool_load.tracker import PoolAdvice
    from exporter.snapshot import FleetSnapshot
    from exporter.thresholds import Thresholds

# The order /metrics lists the stages' families in (the golden exposition's): a stage's place
# in the cycle is when it runs, its place here where its families are read.
RENDER_ORDER = ("nvlink", "analysis", "load", "advisor", "health", "preemption", "logs", "table")

# The stages that still run on a blind frame (a source read no GPU, or part of its fleet:
# exporter/collect.py): what they add does not need the whole fleet, the table in force and
# each GPU's verdict and NVLink rate on its own readings. The others would derive a fleet of
# 0, or of a fraction, and present it as the fleet: they are left out, and so are their families.
BLIND_SAFE = ("table", "nvlink", "health")


@dataclass(frozen=True, slots=True)
class Frame:
    """One snapshot and everything the cycle concluded from it, in stage order. A field a
    stage did not run for (analysis off, no advisor) stays None."""

    snapshot: FleetSnapshot
    table: Thresholds | None = None  # the threshold table in force for this snapshot
    report: Report | None = None  # fragmentation, per node, pool and cluster
    load: tuple[PoolAdvice, ...] | None = None  # the pools' load and scaling hints
    health: HealthView | None = None  # verdicts, remediation events, stragglers
    advice: Advice | None = None  # the advisor's evaluation of this snapshot
    # why the snapshot is blind (one line per source); () when every source saw its fleet
    blind: tuple[str, ...] = ()
    # (stage, its families) once taken (with_exposition), in RENDER_ORDER
    families: tuple[tuple[str, tuple[Family, ...]], ...] = ()


class Stage(Protocol):
    """One step of the cycle: ``step`` returns the frame with this stage's result set.

    ``name`` is the stage's part of the exposition (:data:`RENDER_ORDER`); ``families``
    reads what ``step`` left for that frame."""

    name: str

    def step(self, frame: Frame) -> Frame: ...

    def families(self, frame: Frame) -> Iterable[Family]: ...


def runs(stage: Stage, frame: Frame) -> bool:
    """Whether ``stage`` runs on ``frame`` (and gives families for it): always, except a
    stage outside :data:`BLIND_SAFE` on a blind frame."""
    return not frame.blind or stage.name in BLIND_SAFE


def run_cycle(stages: Sequence[Stage], snapshot: FleetSnapshot, blind: tuple[str, ...] = ()) -> Frame:
    """The one cycle ``serve`` and ``simulate`` both run: ``snapshot`` through ``stages`` in
    order (on a ``blind`` snapshot only those of :data:`BLIND_SAFE`). Blocking (the analysis
    and the planner are CPU work): serve calls it in a worker thread, one cycle at a time."""
    frame = Frame(snapshot, blind=blind)
    for stage in stages:
        if runs(stage, frame):
            frame = stage.step(frame)
        elif (skipped := getattr(stage, "skipped", None)) is not None:
            skipped(frame)  # a stage whose kept state must know it missed a frame
    return frame


def with_exposition(frame: Frame, parts: Iterable[tuple[str, Iterable[Family]]]) -> Frame:
    """``frame`` with the families of ``parts`` (stage name, families) taken, in
    :data:`RENDER_ORDER`; a part named twice keeps both, in the order given."""
    taken = [(name, tuple(families)) for name, families in parts]
    unknown = {name for name, _ in taken} - set(RENDER_ORDER)
    if unknown:
        raise ValueError(f"exposition parts {sorted(unknown)} are not in RENDER_ORDER")
    ordered = sorted(taken, key=lambda part: RENDER_ORDER.index(part[0]))  # stable
    return dataclasses.replace(frame, families=tuple(ordered))


def exposition(frame: Frame) -> list[Family]:
    """Every family the frame's stages gave, in :data:`RENDER_ORDER`: what /metrics renders
    beside the snapshot's own families."""
    return [family for _, families in frame.families for family in families]


__all__ = ["BLIND_SAFE", "RENDER_ORDER", "Frame", "Stage", "exposition", "run_cycle", "runs",
           "with_exposition"]
