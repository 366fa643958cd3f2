"""Why a queued job waits: for capacity, or for fragmentation.

Two columns, no third: every waiting GPU-second is one or the other.

- A job that does **not fit now** is *fragmentation-blocked* when a repack could
  give it room, else *capacity-blocked*. What a repack could give, per GPU model
  it may use: nodes of the same model and GPU count are alike, so a move between
  them always fits by size, and the free GPU shares of such a class of nodes are
  taken as poolable: a class of ``n`` nodes with ``F`` free GPUs (whole ones, the
  floor of its free shares, for a job of whole GPUs) could make ``min(n, F // g)``
  of its nodes hold a part of ``g`` GPUs, one part a node (a gang's parts run on
  distinct nodes). Summed over the classes with at least ``g`` GPUs a node, that is
  the number of parts the model could hold after a repack; a job of ``parts`` parts
  needs that many on one model. Moves between classes (a job from an 8-GPU node to
  a 4-GPU one) are not counted, nor the jobs' sizes (a class's free GPUs may sit
  beside jobs too big to move into them), nor that gang parts do not move, nor CPUs.
- A job that **fits now** (on a model it may use, as many nodes as it has parts with
  room for a part, now, CPUs not counted) waits only for the queue's order: behind
  the blocked heads of its partitions, which the scheduler keeps off the nodes they
  reserve. It takes their reason: fragmentation-blocked if a head of a partition it
  may use is (a repack that started that head would let the queue go on), else
  capacity-blocked. With no head to wait for (per-pod retry, or a placement the
  placer refused though the room is there) it is fragmentation-blocked.

A job asking no GPU is never capacity-blocked (it waits no GPU-hours either way).

:class:`WaitSplit` integrates the queue's waiting GPU-seconds between the run's
events, when the fleet does not change, into the two kinds, for whole-node jobs
and for all; it counts the same jobs and seconds as the outcomes' totals: jobs
submitted in the measured window, until their first start, and again from an eviction
that requeued them until they start again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from exporter.analysis.state import EPS
from exporter.outcome_sim.free_counts import FreeCounts, share_needed
from exporter.outcome_sim.timeline import Job
from exporter.placement.engine import Placer

if TYPE_CHECKING:
    from exporter.outcome_sim.scheduler import Scheduler

# (whole-node, capacity-blocked): the four cells a wait falls in
KINDS: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, False), (True, True))


@dataclass(frozen=True, slots=True)
class RepackRoom:
    """Per GPU model and node size: the free GPU shares, and how many nodes could hold a part."""

    model_names: tuple[str, ...]
    sizes: tuple[int, ...]  # node GPU counts, ascending
    free: tuple[tuple[float, ...], ...]  # [model][i]: free shares on the model's nodes of sizes[i] GPUs
    # GPUs a part asks -> [model][i]: the nodes of sizes[i] GPUs whose GPUs not held by gang parts
    # (which no repack moves) are that many or more
    hosts: Callable[[int], tuple[tuple[int, ...], ...]]

    def parts(self, model: int, gpus: int, share: float) -> int:
        """How many parts of ``gpus`` GPUs (``share`` of each) a repack could place on distinct
        nodes of ``model``."""
        whole = share >= 1.0 - EPS
        need = gpus if whole else gpus * share
        hosts = self.hosts(gpus)[model]
        count = 0
        for i, size in enumerate(self.sizes):
            if size < gpus or not hosts[i]:
                continue
            free = self.free[model][i]
            if whole:
                free = math.floor(free + EPS)
            count += min(hosts[i], int((free + EPS) // need))
        return count


def capacity_blocked(room: RepackRoom, gpus: int, share: float, parts: int,
                     models: tuple[str, ...]) -> bool:
    """Whether a job of ``parts`` x ``gpus`` GPUs (``share`` of each) on one of ``models``
    (empty: any) lacks room on every model even after a repack (:class:`RepackRoom`)."""
    if gpus == 0:
        return False
    for m, name in enumerate(room.model_names):
        if models and name not in models:
            continue
        if room.parts(m, gpus, share) >= parts:
            return False
    return True


@dataclass(slots=True)
class _Waiting:
    """The counted jobs of one shape in the queue: they ask for the same."""

    count: int
    demand: float  # GPUs each asks for
    whole_node: bool
    asks: tuple[int, float, int, tuple[str, ...]]  # what the rule reads: GPUs a part, share, parts, models
    job: Job  # one of them: the scheduler's partitions are told from a job


@dataclass
class WaitSplit:
    """The waiting GPU-seconds of the queue, split by why each job waited.

    The run tells it which jobs join the queue (:meth:`joined`) and which start
    (:meth:`left`), and the seconds between its events (:meth:`accrue`), during which
    the fleet does not change. ``scheduler``: whose heads a job that fits now waits
    behind (None: such a job is fragmentation-blocked).
    """

    placer: Placer
    since: float  # the measured window's start: only jobs submitted from then count
    scheduler: Scheduler | None = None
    # per node, its GPUs with a part's share free, and per model the nodes with g such GPUs or
    # more: the cluster's, which the scheduler keeps too (None: one of its own for ``placer``)
    free: FreeCounts | None = None
    # (whole_node, capacity) -> GPU-seconds waited
    seconds: dict[tuple[bool, bool], float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    _waiting: dict[tuple, _Waiting] = field(init=False, repr=False, default_factory=dict)  # by shape
    _jobs: set[int] = field(init=False, repr=False, default_factory=set)
    _cell: np.ndarray = field(init=False, repr=False)
    _sizes: tuple[int, ...] = field(init=False, repr=False)
    _room: RepackRoom | None = field(init=False, repr=False, default=None)
    _blocked: dict[tuple, bool] = field(init=False, repr=False, default_factory=dict)  # in _room
    _blocked_version: int = field(init=False, repr=False, default=-1)  # _fixed_version for _blocked
    # running gangs: id -> (the job, its version when counted, (node, GPUs held) per part)
    _gangs: dict[int, tuple[Job, int, tuple[tuple[int, float], ...]]] = field(
        init=False, repr=False, default_factory=dict)
    _fixed: np.ndarray = field(init=False, repr=False)  # per node, GPUs held by gang parts
    _fixed_version: int = field(init=False, repr=False, default=0)  # bumped as _fixed changes
    _hosts: dict[int, tuple[tuple[int, ...], ...]] = field(init=False, repr=False, default_factory=dict)
    _hosts_version: int = field(init=False, repr=False, default=-1)
    _model_indices: dict[tuple[str, ...], tuple[int, ...]] = field(
        init=False, repr=False, default_factory=dict)  # allowed models -> their indices
    # (the placer's clock, the scheduler's heads by partition) when _why was told, and per shape
    # whether its jobs are capacity-blocked: the same while neither changes
    _why_state: tuple = field(init=False, repr=False, default=())
    _why: dict[tuple, bool] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        counts = self.placer.gpu_count
        self._sizes = tuple(int(s) for s in np.unique(counts))
        self._cell = self.placer.model * len(self._sizes) + np.searchsorted(np.array(self._sizes), counts)
        self._fixed = np.zeros(len(counts))
        if self.free is None:
            self.free = FreeCounts(self.placer)

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
                0, job.demand, job.whole_node, (job.gpus, job.share, job.parts, job.models), job)
        waiting.count += 1

    def left(self, jobs: Iterable[Job]) -> None:
        """``jobs`` started."""
        for job in jobs:
            if job.parts > 1 and job.id not in self._gangs:
                self._gangs[job.id] = (job, -1, ())  # counted at the next accrue
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
        self._count_gangs()
        return RepackRoom(placer.model_names, self._sizes,
                          tuple(tuple(row) for row in free.reshape(models, sizes).tolist()), self.hosts)

    def _count_gangs(self) -> None:
        """Bring the GPUs gang parts hold per node up to date: a gang that started, moved or
        stopped since (its version changed)."""
        running = self.scheduler.cluster.running if self.scheduler is not None else None
        for gang_id, (job, version, held) in list(self._gangs.items()):
            if job.version == version:
                continue
            for node, gpus in held:
                self._fixed[node] -= gpus
            if running is not None and gang_id in running and job.placements:
                held = tuple((p.node, len(p.slots) * p.gpu_share) for p in job.placements)
                for node, gpus in held:
                    self._fixed[node] += gpus
                self._gangs[gang_id] = (job, job.version, held)
            else:
                del self._gangs[gang_id]
            self._fixed_version += 1

    def hosts(self, gpus: int) -> tuple[tuple[int, ...], ...]:
        """Per model and node size, the nodes that could hold a part of ``gpus`` GPUs once every
        single-node job left them: their GPUs less those gang parts hold."""
        if self._hosts_version != self._fixed_version:
            self._hosts, self._hosts_version = {}, self._fixed_version
        found = self._hosts.get(gpus)
        if found is None:
            placer = self.placer
            able = placer.gpu_count - self._fixed >= gpus - EPS
            counts = np.bincount(self._cell[able], minlength=len(placer.model_names) * len(self._sizes))
            found = self._hosts[gpus] = tuple(
                tuple(int(x) for x in row) for row in counts.reshape(-1, len(self._sizes)).tolist())
        return found

    def fits_now(self, gpus: int, share: float, parts: int, models: tuple[str, ...]) -> bool:
        """Whether a model it may use has, now, ``parts`` nodes with ``gpus`` GPUs of ``share``
        free each (CPUs not counted)."""
        if gpus == 0:
            return True
        assert self.free is not None  # set in __post_init__
        table = self.free.at_least(share_needed(share))
        if gpus >= len(table[0]):
            return False
        return any(table[m][gpus] >= parts for m in self._models_of(models))

    def _models_of(self, models: tuple[str, ...]) -> tuple[int, ...]:
        """The placer's indices of ``models`` (every model when empty), in the placer's order."""
        found = self._model_indices.get(models)
        if found is None:
            names = self.placer.model_names
            found = self._model_indices[models] = tuple(
                m for m, name in enumerate(names) if not models or name in models)
        return found

    def accrue(self, span: float) -> None:
        """Count ``span`` seconds of the waiting jobs, against the fleet as it is now."""
        if span <= 0 or not self._waiting:
            return
        # a shape's reason depends on the fleet (any change bumps the placer's clock; a gang
        # starts, moves or stops only so) and on the heads: most events between two accruals are
        # arrivals that change neither, and then only new shapes are told
        heads = self.scheduler.head_of if self.scheduler is not None else {}
        state = (self.placer._clock, tuple((p, h.id) for p, h in heads.items()))
        if state != self._why_state:
            self._why_state, self._why = state, {}
        why = self._why
        room: RepackRoom | None = None
        reasons: dict[int, bool] = {}  # head id -> capacity-blocked
        for key, w in self._waiting.items():
            capacity = why.get(key)
            if capacity is None:
                if room is None:
                    room = self._current_room()
                capacity = why[key] = self._reason(w, room, reasons)
            self.seconds[(w.whole_node, capacity)] += w.count * w.demand * span

    def _current_room(self) -> RepackRoom:
        room = self.room()
        if self._room is None or room.free != self._room.free or self._blocked_version != self._fixed_version:
            self._room, self._blocked, self._blocked_version = room, {}, self._fixed_version
        return room

    def _reason(self, w: _Waiting, room: RepackRoom, reasons: dict[int, bool]) -> bool:
        """Whether the jobs of ``w`` wait for capacity (else for fragmentation), now."""
        if self.fits_now(*w.asks):
            return self._behind(w.job, room, reasons)
        blocked = self._blocked
        if w.asks not in blocked:
            blocked[w.asks] = capacity_blocked(room, *w.asks)
        return blocked[w.asks]

    def _behind(self, job: Job, room: RepackRoom, reasons: dict[int, bool]) -> bool:
        """A job that fits now: capacity-blocked when every head it waits behind is."""
        scheduler = self.scheduler
        if scheduler is None or not scheduler.head_of:
            return False
        ahead = (scheduler.head_of.get(p) for p in scheduler.partitions(job))
        heads = {h.id: h for h in ahead if h is not None}
        if not heads:
            return False
        for head in heads.values():
            capacity = reasons.get(head.id)
            if capacity is None:
                capacity = capacity_blocked(room, head.gpus, head.share, head.parts, head.models)
                reasons[head.id] = capacity
            if not capacity:
                return False
        return True

    def hours(self, whole_node: bool, capacity: bool) -> float:
        return self.seconds[(whole_node, capacity)] / 3600


__all__ = ["KINDS", "RepackRoom", "WaitSplit", "capacity_blocked"]
