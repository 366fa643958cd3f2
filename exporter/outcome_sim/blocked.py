"""Why a queued job waits: for capacity, or for fragmentation.

A queued job is *capacity-blocked* when no GPU model it may use has enough free
GPU room for it even after a perfect repack; otherwise it is
*fragmentation-blocked*: the room is there in total, but not in a placement (a
job that fits now but waits behind the queue's order counts here too).

What a perfect repack could free, per model: the free GPU shares of the model's
nodes that could hold one of the job's parts (nodes with at least as many GPUs
as a part asks), summed. A job of whole GPUs needs the floor of that sum to
reach its GPUs (parts x GPUs per part); a job of GPU shares needs the sum to
reach its shares. A gang is judged by its total alone: that a repack could also
empty ``parts`` distinct nodes is assumed, not checked, and CPUs are not
counted, so capacity-blocked is a lower bound. A job asking no GPU is never
capacity-blocked (it waits no GPU-hours either way).

:class:`WaitSplit` integrates the queue's waiting GPU-seconds between the run's
events, when the fleet does not change, into the two kinds, for whole-node jobs
and for all; it counts the same jobs and seconds as the outcomes' totals: jobs
submitted in the measured window, until their first start, and again from an eviction
that requeued them until they start again.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.state import EPS
from exporter.outcome_sim.timeline import Job
from exporter.placement.engine import Placer

# (whole-node, capacity-blocked): the four cells a wait falls in
KINDS: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, False), (True, True))


@dataclass(frozen=True, slots=True)
class RepackRoom:
    """Free GPU shares per GPU model and node size: what a perfect repack could gather."""

    model_names: tuple[str, ...]
    sizes: tuple[int, ...]  # node GPU counts, ascending
    # [model][i]: free shares summed over the model's nodes of sizes[i] GPUs or more
    at_least: tuple[tuple[float, ...], ...]

    def room(self, model: int, gpus: int) -> float:
        """Free shares on the model's nodes that could hold a part of ``gpus`` GPUs."""
        i = bisect.bisect_left(self.sizes, gpus)
        return self.at_least[model][i] if i < len(self.sizes) else 0.0


def capacity_blocked(room: RepackRoom, gpus: int, share: float, parts: int,
                     models: tuple[str, ...]) -> bool:
    """Whether a job of ``parts`` x ``gpus`` GPUs (``share`` of each) on one of ``models``
    (empty: any) lacks room on every model even after a perfect repack."""
    if gpus == 0:
        return False
    whole = share >= 1.0 - EPS
    need = gpus * parts if whole else gpus * share * parts
    for m, name in enumerate(room.model_names):
        if models and name not in models:
            continue
        have = room.room(m, gpus)
        if whole:
            have = math.floor(have + EPS)
        if have >= need - EPS:
            return False
    return True


@dataclass(slots=True)
class _Waiting:
    """The counted jobs of one shape in the queue: they ask for the same."""

    count: int
    demand: float  # GPUs each asks for
    whole_node: bool
    asks: tuple[int, float, int, tuple[str, ...]]  # what the rule reads: GPUs a part, share, parts, models


@dataclass
class WaitSplit:
    """The waiting GPU-seconds of the queue, split by why each job waited.

    The run tells it which jobs join the queue (:meth:`joined`) and which start
    (:meth:`left`), and the seconds between its events (:meth:`accrue`), during which
    the fleet does not change.
    """

    placer: Placer
    since: float  # the measured window's start: only jobs submitted from then count
    # (whole_node, capacity) -> GPU-seconds waited
    seconds: dict[tuple[bool, bool], float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    _waiting: dict[tuple, _Waiting] = field(init=False, repr=False, default_factory=dict)  # by shape
    _jobs: set[int] = field(init=False, repr=False, default_factory=set)
    _cell: np.ndarray = field(init=False, repr=False)
    _sizes: tuple[int, ...] = field(init=False, repr=False)
    _room: RepackRoom | None = field(init=False, repr=False, default=None)
    _blocked: dict[tuple, bool] = field(init=False, repr=False, default_factory=dict)  # in _room

    def __post_init__(self) -> None:
        counts = self.placer.gpu_count
        self._sizes = tuple(int(s) for s in np.unique(counts))
        self._cell = self.placer.model * len(self._sizes) + np.searchsorted(np.array(self._sizes), counts)

    def joined(self, job: Job) -> None:
        """``job`` was queued. Counted when the outcomes count its wait: submitted in the window,
        never started, or evicted back into the queue (its second wait counts too)."""
        started = job.start is not None and job.requeued is None
        if job.submit < self.since or started or job.id in self._jobs:
            return
        self._jobs.add(job.id)
        waiting = self._waiting.get(job.shape_key)
        if waiting is None:
            waiting = self._waiting[job.shape_key] = _Waiting(
                0, job.demand, job.whole_node, (job.gpus, job.share, job.parts, job.models))
        waiting.count += 1

    def left(self, jobs: Iterable[Job]) -> None:
        """``jobs`` started."""
        for job in jobs:
            if job.id not in self._jobs:
                continue
            self._jobs.discard(job.id)
            waiting = self._waiting[job.shape_key]
            waiting.count -= 1
            if not waiting.count:
                del self._waiting[job.shape_key]

    def room(self) -> RepackRoom:
        placer = self.placer
        models, sizes = len(placer.model_names), len(self._sizes)
        free = np.bincount(self._cell, weights=placer.gpu_free.sum(axis=1), minlength=models * sizes)
        at_least = free.reshape(models, sizes)[:, ::-1].cumsum(axis=1)[:, ::-1]
        return RepackRoom(placer.model_names, self._sizes, tuple(tuple(row) for row in at_least.tolist()))

    def accrue(self, span: float) -> None:
        """Count ``span`` seconds of the waiting jobs, against the fleet as it is now."""
        if span <= 0 or not self._waiting:
            return
        room = self.room()
        if self._room is None or room.at_least != self._room.at_least:
            self._room, self._blocked = room, {}
        blocked = self._blocked
        for w in self._waiting.values():
            capacity = blocked.get(w.asks)
            if capacity is None:
                capacity = blocked[w.asks] = capacity_blocked(room, *w.asks)
            self.seconds[(w.whole_node, capacity)] += w.count * w.demand * span

    def hours(self, whole_node: bool, capacity: bool) -> float:
        return self.seconds[(whole_node, capacity)] / 3600


__all__ = ["KINDS", "RepackRoom", "WaitSplit", "capacity_blocked"]
