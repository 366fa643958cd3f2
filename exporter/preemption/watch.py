"""Count each stop of a job once, with the work it lost; add up the GPU-seconds each pool
delivered; list the stopped jobs that wait to resume.

A stop is known by the job, its cause, its count and its time
(:class:`exporter.snapshot.Interruption`): seen again on the next snapshot it is the same stop,
never counted twice, and a job requeued again (Slurm's Restarts grows) is a new one.

The work a stop lost is the time from the job's last checkpoint to the stop: the checkpoint
it states (a Slurm comment's ``last-checkpoint=``, the pod annotation
``gpufleet.io/last-checkpoint``; :mod:`exporter.sources.job_hints`), or, for a job that
states none, the time since the last whole ``checkpoint_interval`` of its run
(``advisor.assume_checkpointing``, as the advisor prices a move), or its whole run where the
site assumes no checkpointing. A checkpoint older than the run it was stopped in (the run
restored from it) counts from the run's start: the earlier work was saved. Slurm clears what
it knew of the run it requeued (22.05: StartTime is the next one's, PreemptTime 0; while the
job completes it lists no GRES of its own, and the node's GresUsed no longer counts them, as
after a cancel: recorded on the test cluster), so the run's start and GPUs are those this
watch saw it running with; a job requeued before the
exporter first saw it is counted, and its lost work only where it states a checkpoint.

What it keeps is bounded by the snapshot: the jobs of the last snapshot (forgotten when they
leave it) and one counter per pool and cause.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter import metrics
from exporter.metrics import Family
from exporter.snapshot import Allocation, FleetSnapshot, Interruption

# The causes the sources give (exporter.snapshot.Interruption), in the order the counters list
# them; any other is counted as "other". Every pool has a series of each from its first
# snapshot, 0 until its first stop, so increase() counts that stop too.
SLURM_CAUSES = ("requeue", "suspend")
KUBERNETES_CAUSES = ("preemption", "eviction", "kubelet", "taint", "gc")
CAUSES = (*SLURM_CAUSES, *KUBERNETES_CAUSES, "other")

# A gap between two snapshots longer than this (the exporter stopped, a source was down) adds
# only this much delivered time: what ran meanwhile is not known.
DEFAULT_MAX_GAP_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class WatchSettings:
    # seconds between the checkpoints of a job that states none; None: it saves nothing
    checkpoint_interval: float | None = 900.0
    max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS


@dataclass(frozen=True, slots=True)
class Stop:
    """One stop of a job, counted on the snapshot that first showed it."""

    job: str
    namespace: str
    pool: str
    cause: str
    time: float  # unix seconds: the source's, else the snapshot's that showed it
    gpus: float  # GPUs the job held when stopped (shares added up)
    lost_seconds: float | None  # work lost per GPU; None: neither a checkpoint nor the run known

    @property
    def lost_gpu_seconds(self) -> float:
        return 0.0 if self.lost_seconds is None else self.lost_seconds * self.gpus


@dataclass(frozen=True, slots=True)
class Waiting:
    """A stopped job that has not resumed: requeued and pending, or suspended."""

    job: str
    namespace: str
    pool: str
    cause: str
    since: float  # unix seconds it was stopped
    lost_seconds: float | None


@dataclass(frozen=True, slots=True)
class PreemptionView:
    """What one snapshot showed: the stops first seen on it and the jobs waiting."""

    taken_at: float
    stops: tuple[Stop, ...] = ()
    waiting: tuple[Waiting, ...] = ()


_Key = tuple[str, int, float | None]


@dataclass(frozen=True, slots=True)
class _Run:
    """A running job as last seen: what its stop would have lost."""

    pool: str
    gpus: float
    start: float | None
    checkpoint: float | None


def lost_work(stopped: float, checkpoint: float | None, start: float | None,
              interval: float | None) -> float | None:
    """Seconds of work per GPU a stop at ``stopped`` lost (module docstring); None: unknown."""
    if checkpoint is not None:
        since = checkpoint if start is None else max(checkpoint, start)
        return max(0.0, stopped - since)
    if start is None:
        return None
    ran = max(0.0, stopped - start)
    if interval is None or interval <= 0:
        return ran
    return ran % interval


def _gpus(alloc: Allocation) -> float:
    return sum(len(p.gpus) * p.gpu_share for p in alloc.placements)


def _cause(interruption: Interruption) -> str:
    return interruption.cause if interruption.cause in CAUSES else "other"


@dataclass
class PreemptionWatch:
    settings: WatchSettings = field(default_factory=WatchSettings)
    _runs: dict[str, _Run] = field(default_factory=dict)
    # job -> the stop last counted for it, by its identity (cause, count, time): a job stopped
    # is remembered as its stop while it stays stopped, its run being gone from the snapshot
    _counted: dict[str, tuple[_Key, Stop]] = field(default_factory=dict)
    _stops: dict[tuple[str, str], int] = field(default_factory=dict)
    _lost: dict[tuple[str, str], float] = field(default_factory=dict)
    _delivered: dict[str, float] = field(default_factory=dict)
    _held: dict[str, float] = field(default_factory=dict)  # GPUs working per pool, last snapshot
    _last: float | None = None
    view: PreemptionView | None = None

    def observe(self, snapshot: FleetSnapshot) -> PreemptionView:
        now = snapshot.taken_at
        self._deliver(now)
        pools = {n.name: n.pool for n in snapshot.nodes}
        stops: list[Stop] = []
        waiting: list[Waiting] = []
        runs: dict[str, _Run] = {}
        counted: dict[str, tuple[_Key, Stop]] = {}
        held: dict[str, float] = {}
        for alloc in snapshot.allocations:
            pool = next((pools[p.node] for p in alloc.placements if p.node in pools), "")
            gpus = _gpus(alloc)
            start = alloc.start_time
            before = self._runs.get(alloc.job)
            if before is not None and before.start is not None:
                # one run has one start: Slurm 22.05 rewrites a requeued job's StartTime to the
                # requeue while it completes (COMPLETING, its Restarts already grown)
                start = before.start
            # and lists it without its GPUs (squeue --json's gres_detail empty): its stop lost
            # the work of the GPUs it was seen running on
            run = _Run(pool, gpus if gpus or before is None else before.gpus, start,
                       alloc.last_checkpoint_time)
            if alloc.interrupted is None:
                runs[alloc.job] = run
                held[pool] = held.get(pool, 0.0) + gpus
                continue
            stop, new = self._stop(alloc.job, alloc.namespace, alloc.interrupted, run, now,
                                   counted)
            if new:
                stops.append(stop)
            if alloc.interrupted.cause == "suspend":  # a stopping pod is gone, not waiting
                waiting.append(Waiting(alloc.job, alloc.namespace, stop.pool, stop.cause,
                                       stop.time, stop.lost_seconds))
        for request in snapshot.pending:
            if request.interrupted is None:
                continue
            seen = self._runs.get(request.job)
            run = seen if seen is not None else _Run(
                request.pool, request.gpu_count * request.gpu_share, None, None)
            if request.last_checkpoint_time is not None:
                run = _Run(run.pool, run.gpus, run.start, request.last_checkpoint_time)
            stop, new = self._stop(request.job, "", request.interrupted, run, now, counted)
            if new:
                stops.append(stop)
            waiting.append(Waiting(request.job, "", stop.pool, stop.cause, stop.time,
                                   stop.lost_seconds))
        for stop in stops:
            key = (stop.pool, stop.cause)
            self._stops[key] = self._stops.get(key, 0) + 1
            self._lost[key] = self._lost.get(key, 0.0) + stop.lost_gpu_seconds
        for pool in {*held, *(s.pool for s in stops), *(w.pool for w in waiting)}:
            self._delivered.setdefault(pool, 0.0)
            for cause in CAUSES:
                self._stops.setdefault((pool, cause), 0)
                self._lost.setdefault((pool, cause), 0.0)
        self._runs, self._counted, self._held = runs, counted, held
        self.view = PreemptionView(now, tuple(stops), tuple(waiting))
        return self.view

    def _deliver(self, now: float) -> None:
        """Add the GPU-seconds the last snapshot's working jobs delivered until ``now``."""
        if self._last is not None:
            elapsed = min(max(0.0, now - self._last), self.settings.max_gap_seconds)
            for pool, gpus in self._held.items():
                self._delivered[pool] = self._delivered.get(pool, 0.0) + gpus * elapsed
        self._last = now if self._last is None else max(self._last, now)

    def _stop(self, job: str, namespace: str, interruption: Interruption, run: _Run,
              now: float, counted: dict[str, tuple[_Key, Stop]]) -> tuple[Stop, bool]:
        """The job's stop, and whether it is new (not counted on an earlier snapshot)."""
        key = (interruption.cause, interruption.count, interruption.time)
        known = self._counted.get(job)
        if known is not None and known[0] == key:
            counted[job] = known
            return known[1], False
        seen = self._runs.get(job)
        start = run.start if run.start is not None else (seen.start if seen else None)
        checkpoint = run.checkpoint if run.checkpoint is not None else (
            seen.checkpoint if seen else None)
        pool = seen.pool if seen is not None and seen.pool else run.pool
        gpus = seen.gpus if seen is not None else run.gpus
        when = interruption.time if interruption.time is not None else now
        lost = lost_work(when, checkpoint, start, self.settings.checkpoint_interval)
        stop = Stop(job, namespace, pool, _cause(interruption), when, gpus, lost)
        counted[job] = (key, stop)
        return stop, True

    def families(self) -> list[Family]:
        view = self.view
        waiting = () if view is None else view.waiting
        # every pool and cause the counters have, 0 where no job waits: a panel or rule reads 0
        by_pool: dict[tuple[str, str], int] = dict.fromkeys(self._stops, 0)
        for entry in waiting:
            by_pool[(entry.pool, entry.cause)] = by_pool.get((entry.pool, entry.cause), 0) + 1
        now = 0.0 if view is None else view.taken_at
        return [
            metrics.PREEMPTIONS_TOTAL.family(_pairs(self._stops)),
            metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.family(_pairs(self._lost)),
            metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.family(
                [((("pool", pool),), value) for pool, value in sorted(self._delivered.items())]),
            metrics.PREEMPTED_JOBS_WAITING.family(_pairs(by_pool)),
            metrics.JOB_PREEMPTED_WAIT_SECONDS.family(
                [(_job_labels(w), max(0.0, now - w.since)) for w in waiting]),
            metrics.JOB_PREEMPTION_LOST_SECONDS.family(
                [(_job_labels(w), w.lost_seconds) for w in waiting if w.lost_seconds is not None]),
        ]


def _pairs(values: dict[tuple[str, str], float] | dict[tuple[str, str], int],
           ) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    return [((("pool", pool), ("cause", cause)), float(value))
            for (pool, cause), value in sorted(values.items(), key=lambda kv: (
                kv[0][0], CAUSES.index(kv[0][1])))]


def _job_labels(entry: Waiting) -> tuple[tuple[str, str], ...]:
    return (("job", entry.job), ("namespace", entry.namespace), ("pool", entry.pool),
            ("cause", entry.cause))


def stops_in(views: Iterable[PreemptionView]) -> list[Stop]:
    """Every stop of a run of views, in order (tests and the simulator read them so)."""
    return [stop for view in views for stop in view.stops]
