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
RENDER_ORDER = ("analysis", "load", "advisor", "health", "logs", "table")


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
    # (stage, its families) once taken (with_exposition), in RENDER_ORDER
    families: tuple[tuple[str, tuple[Family, ...]], ...] = ()


class Stage(Protocol):
    """One step of the cycle: ``step`` returns the frame with this stage's result set.

    ``name`` is the stage's part of the exposition (:data:`RENDER_ORDER`); ``families``
    reads what ``step`` left for that frame."""

    name: str

    def step(self, frame: Frame) -> Frame: ...

    def families(self, frame: Frame) -> Iterable[Family]: ...


def run_cycle(stages: Sequence[Stage], snapshot: FleetSnapshot) -> Frame:
    """The one cycle ``serve`` and ``simulate`` both run: ``snapshot`` through ``stages`` in
    order. Blocking (the analysis and the planner are CPU work): serve calls it in a worker
    thread, one cycle at a time."""
    frame = Frame(snapshot)
    for stage in stages:
        frame = stage.step(frame)
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


__all__ = ["RENDER_ORDER", "Frame", "Stage", "exposition", "run_cycle", "with_exposition"]
