"""The preemption watch as a stage of the cycle (:mod:`exporter.cycle`): it reads only the
snapshot, keeps its own counters, and runs in node and cluster mode alike (no numpy, nothing
of the advisor's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from exporter.preemption.watch import PreemptionWatch, WatchSettings

if TYPE_CHECKING:
    from exporter.config import AdvisorConfig
    from exporter.metrics import Family
    from exporter.snapshot import FleetSnapshot
    from exporter.thresholds import Thresholds


def watch_settings(config: AdvisorConfig, table: Thresholds | None) -> WatchSettings:
    """The checkpoint interval a job that states none is taken to keep: the advisor's, as it
    prices a move (``advisor.checkpoint_interval``, or the threshold table's when left at its
    default), None where the site assumes no checkpointing."""
    from exporter.thresholds.defaults import follows_table

    if not config.assume_checkpointing:
        return WatchSettings(checkpoint_interval=None)
    if table is not None and follows_table(config.checkpoint_interval):
        return WatchSettings(checkpoint_interval=table.checkpoint_interval())
    return WatchSettings(checkpoint_interval=float(config.checkpoint_interval))


class _Framed(Protocol):
    # the cycle's frame, as far as this stage reads it: typed here, not imported, since the
    # advisor imports this package's advice and the cycle imports the advisor
    @property
    def snapshot(self) -> FleetSnapshot: ...


F = TypeVar("F", bound=_Framed)


@dataclass
class PreemptionStage:
    watch: PreemptionWatch
    name: str = "preemption"

    def step(self, frame: F) -> F:
        # what it concluded stays in the watch (its families and ``watch.view``), as the
        # load stage's tracker: no other stage reads it
        self.watch.observe(frame.snapshot)
        return frame

    def families(self, frame: _Framed) -> list[Family]:
        return self.watch.families()
