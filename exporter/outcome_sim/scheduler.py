"""The queue and the scheduler's passes: FIFO with backfill (as Slurm), or per-pod retry (as Kubernetes).

Order: high-priority jobs before spot ones, then by submit time (an evicted job
keeps its place: it was submitted when it was). A pass runs after every batch of
events at one instant.

- ``fifo`` (FIFO with EASY backfill, Slurm's ``sched/backfill`` in its simplest
  form): jobs start in order while they fit. The first that does not is the
  head; it gets a reservation: the nodes it could start on soonest and when (the
  shadow time), computed from the running jobs' ends (their true durations:
  every job's time limit is exact). Up to ``backfill_depth`` later jobs may
  start out of order if they fit off the reserved nodes, or end by the shadow time.
- ``kube`` (Kubernetes' scheduling queue): every pending pod is tried in order at
  each pass; a pod that does not fit waits for the next cluster event (a release)
  and never blocks the pods behind it, so large pods can starve behind small ones.

A job that does not fit even the empty fleet is refused at submit (``rejected``).
Each pass is cheap whatever the queue's length: jobs are grouped by what they ask
for, and a group that failed since the last release of capacity is skipped whole.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from exporter.analysis.state import EPS
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.timeline import Job

MODES = ("fifo", "kube")


def order_key(job: Job) -> tuple[int, float, int]:
    # a spot job paused by a preemption resumes ahead of the spot jobs that never ran
    return (0 if job.high else 1 if job.paused else 2, job.submit, job.id)


@dataclass(frozen=True, slots=True)
class Reservation:
    job: int
    shadow: float  # when the head could start at the latest, if nothing else changes
    nodes: tuple[int, ...]  # where


@dataclass
class Queue:
    groups: dict[tuple, list[tuple[tuple[int, float, int], Job]]] = field(default_factory=dict)
    size: int = 0
    demand: float = 0.0  # GPUs the queued jobs ask for
    added: int = 0  # jobs ever added

    def add(self, job: Job) -> None:
        self.added += 1
        bisect.insort(self.groups.setdefault(job.shape_key, []), (order_key(job), job),
                      key=lambda entry: entry[0])
        self.size += 1
        self.demand += job.demand

    def remove(self, job: Job) -> None:
        group = self.groups[job.shape_key]
        key = order_key(job)
        at = bisect.bisect_left(group, key, key=lambda entry: entry[0])
        if at >= len(group) or group[at][1] is not job:
            raise ValueError(f"job {job.id} is not queued")
        del group[at]
        if not group:
            del self.groups[job.shape_key]
        self.size -= 1
        self.demand -= job.demand

    def ordered(self):  # type: ignore[no-untyped-def]
        """Jobs in queue order, merged from the groups; ``send(False)`` skips the rest of a group."""
        heap = [(g[0][0], k, 0) for k, g in self.groups.items()]
        heapq.heapify(heap)
        while heap:
            _, k, i = heapq.heappop(heap)
            group = self.groups[k]
            skip = yield group[i][1]
            if not skip and i + 1 < len(group):
                heapq.heappush(heap, (group[i + 1][0], k, i + 1))

    def jobs(self) -> list[Job]:
        return [j for _, j in sorted((e for g in self.groups.values() for e in g), key=lambda e: e[0])]

    def head(self) -> Job | None:
        best = min((g[0] for g in self.groups.values()), default=None, key=lambda e: e[0])
        return None if best is None else best[1]


@dataclass
class Scheduler:
    cluster: Cluster
    mode: str = "fifo"
    backfill_depth: int = 100
    queue: Queue = field(default_factory=Queue)
    rejected: list[Job] = field(default_factory=list)
    reservation: Reservation | None = None
    blocked: Job | None = None  # the head after the last pass, if it could not start
    _failed: dict[tuple, int] = field(default_factory=dict)  # shape -> releases when it fit nowhere
    _fits_empty: dict[tuple, bool] = field(default_factory=dict)
    # shape -> (releases, reservation) when it fit nowhere off the reserved nodes
    _failed_off: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    _disturbed: int = 0  # moves and evictions so far: a reservation from before may be stale
    _reserved_at: int = -1  # _disturbed when the reservation was made
    _reservations: int = 0  # reservations made so far: the one in force is told by its number
    _model_masks: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)  # nodes of these models
    _last_pass: tuple[int, int, int] | None = None
    # per job, a per-node rank the placer puts before its policy (steering's per-pod preferred
    # nodes: steering.SteerPod), in force for that job's placement only; None: the placer's own
    steer: Callable[[Job], np.ndarray | None] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown scheduler mode {self.mode!r}; one of {', '.join(MODES)}")
        self._empty = Cluster(self.cluster.state, "bestfit")

    def submit(self, job: Job) -> None:
        key = job.shape_key
        if key not in self._fits_empty:
            self._fits_empty[key] = self._empty.find(job) is not None
        if self._fits_empty[key]:
            self.queue.add(job)
        else:
            self.rejected.append(job)

    def requeue(self, job: Job) -> None:
        """An evicted job waits again, in its old place."""
        self.queue.add(job)
        self._disturbed += 1

    def disturbed(self) -> None:
        """Running jobs moved: the head's reservation is recomputed at the next pass."""
        self._disturbed += 1

    def run_pass(self, now: float) -> list[Job]:
        """Start what may start now; the jobs started."""
        cluster = self.cluster
        token = (cluster.releases, self.queue.added, self._disturbed)
        if token == self._last_pass:
            return []  # nothing came back, nothing arrived, nothing moved: what waited still waits
        fifo = self.mode == "fifo"
        started: list[Job] = []
        head: Job | None = None
        examined = 0
        depth = self.backfill_depth
        releases = cluster.releases  # no start in the pass changes it: what fit nowhere still does
        failed, failed_off = self._failed, self._failed_off
        reservation: Reservation | None = None  # the head's, once a job behind it is tried
        off: tuple[int, int] = (releases, 0)
        walk = self.queue.ordered()
        job = next(walk, None)
        while job is not None:
            key = job.shape_key
            skip = False
            placed = None
            if failed.get(key) == releases:
                skip = True  # nothing came back since it fit nowhere: the whole group waits
            elif head is None:
                placed = self._find(job)
                if placed is None:
                    failed[key] = releases
                    skip = True
            else:
                examined += 1
                if examined > depth:
                    break
                # a job behind the blocked head starts if it leaves the head's reservation alone:
                # off the reserved nodes, or ending by the head's shadow time
                if reservation is None:
                    reservation = self._reserve(head, now)
                    off = (releases, self._reservations)
                # it failed off these reserved nodes, and nothing came back since: it still does
                if failed_off.get(key) != off:
                    placed = self._find(job, reservation.nodes)
                    if placed is None:
                        failed_off[key] = off
                if placed is None and now + (job.work - job.done) <= reservation.shadow:
                    placed = self._find(job)
                    if placed is None:
                        failed[key] = releases
            if placed is not None:
                cluster.start(job, placed, now)
                started.append(job)
            elif fifo and head is None:
                head = job
            try:
                job = walk.send(skip)
            except StopIteration:
                job = None
        for job in started:
            self.queue.remove(job)
        self._last_pass = (cluster.releases, self.queue.added, self._disturbed)
        self.blocked = head if fifo else self.queue.head()
        if head is None:
            self.reservation = None
        return started

    def _find(self, job: Job, exclude: tuple[int, ...] = ()) -> list | None:
        """``cluster.find``, asked only when the job could fit: a model it may use has, off
        ``exclude``, as many nodes with room for a part as it has parts. Without that, the
        placer would try a gang part by part, model by model, over the whole fleet, and fail
        (on the GFS fleet a many-worker gang was tried so at every pass)."""
        placer = self.cluster.placer
        room = placer.cpu_free >= job.cpus - EPS
        if job.gpus:
            need = 1.0 if job.share >= 1.0 - EPS else job.share
            room &= np.count_nonzero(placer.gpu_free >= need - EPS, axis=1) >= job.gpus
        if job.models and job.gpus:  # the placer keeps a CPU-only job to no model
            allowed = self._model_masks.get(job.models)
            if allowed is None:
                ids = [i for i, m in enumerate(placer.model_names) if m in job.models]
                allowed = self._model_masks[job.models] = np.isin(placer.model, ids)
            room &= allowed
        if exclude:
            room[list(exclude)] = False
        if job.parts == 1:
            if not room.any():
                return None
        elif np.bincount(placer.model[room], minlength=len(placer.model_names)).max(initial=0) < job.parts:
            return None
        rank = self.steer(job) if self.steer is not None else None
        if rank is None:
            return self.cluster.find(job, exclude=exclude)
        before, placer.preference = placer.preference, rank
        try:
            return self.cluster.find(job, exclude=exclude)
        finally:
            placer.preference = before

    def _reserve(self, head: Job, now: float) -> Reservation:
        held = self.reservation
        if held is not None and held.job == head.id and self._disturbed == self._reserved_at:
            return held
        self.reservation = reserve(self.cluster, head, now)
        self._reserved_at = self._disturbed
        # by number, not id(): a freed reservation's address is reused by a later one, which
        # then passed for it and kept jobs off nodes it no longer reserved
        self._reservations += 1
        return self.reservation


def reserve(cluster: Cluster, head: Job, now: float) -> Reservation:
    """The nodes ``head`` could start on soonest, and when, if the running jobs end as planned.

    Per node: its free GPUs and cores, plus what its jobs give back as they end,
    earliest first, until the head's part fits. A gang needs ``parts`` such nodes of
    one model: the latest of the model's ``parts`` soonest nodes, the best model (on a
    tie, the model of the lowest-numbered node that could take a part).

    One sweep over the fleet's job ends in time order, not one per node: it stops once
    a model has ``parts`` nodes where the head fits (what :func:`reserve_per_node` finds,
    node by node; a test holds the two equal).
    """
    placer = cluster.placer
    need = 1.0 if head.share >= 1.0 - EPS else head.share
    eligible = (placer.gpu_count >= head.gpus) & (placer.cpu_total >= head.cpus - EPS)
    if head.models:
        allowed = [i for i, m in enumerate(placer.model_names) if m in head.models]
        eligible &= np.isin(placer.model, allowed)
    fits = eligible & (placer.cpu_free >= head.cpus - EPS)
    if head.gpus:
        fits &= (placer.gpu_free >= need - EPS).sum(axis=1) >= head.gpus
    when = dict.fromkeys(np.flatnonzero(fits).tolist(), now)
    counts = np.bincount(placer.model[fits], minlength=len(placer.model_names))
    # it fits now on enough nodes: only jobs ending by now can still tie
    shadow = now if counts.max(initial=0) >= head.parts else math.inf
    pending = (eligible & ~fits).tolist()  # a list: indexing a numpy array per part costs more
    ends = []
    for job in cluster.running.values():
        end = None
        for p in job.placements:
            if pending[p.node]:
                end = job.end() if end is None else end
                if end <= shadow:
                    ends.append((end, p.node, p.cpus, p.slots, p.gpu_share))
    ends.sort(key=itemgetter(0))
    rows: dict[int, tuple[list[float], list[float]]] = {}  # node -> (free shares, [free cores])
    for end, node, cpus, slots, share in ends:
        at = max(end, now)
        if at > shadow:
            break
        if node in when:
            continue
        row = rows.get(node)
        if row is None:
            row = rows[node] = (placer.gpu_free[node].tolist(), [float(placer.cpu_free[node])])
        free, cpu = row
        cpu[0] += cpus
        for s in slots:
            free[s] += share
        if cpu[0] >= head.cpus - EPS and (
                head.gpus == 0 or sum(1 for x in free if x >= need - EPS) >= head.gpus):
            when[node] = at
            model = int(placer.model[node])
            counts[model] += 1
            if counts[model] >= head.parts:
                shadow = at  # ends at this same instant are still taken: they tie
    best = Reservation(head.id, math.inf, ())
    if math.isinf(shadow):
        return best
    by_model: dict[int, list[tuple[float, int]]] = {}
    for node in np.flatnonzero(eligible).tolist():  # models in the order of their first node
        by_model.setdefault(int(placer.model[node]), [])
    for node, at in when.items():
        by_model[int(placer.model[node])].append((at, node))
    for times in by_model.values():
        if len(times) < head.parts:
            continue
        times.sort()
        chosen = times[: head.parts]
        if chosen[-1][0] < best.shadow:
            best = Reservation(head.id, chosen[-1][0], tuple(n for _, n in chosen))
    return best


def reserve_per_node(cluster: Cluster, head: Job, now: float) -> Reservation:
    """:func:`reserve` node by node: each node's own ends until the head fits. The reference the
    sweep is tested against (and what it was before)."""
    placer = cluster.placer
    ends: dict[int, list[tuple[float, float, tuple[int, ...], float]]] = {}
    for job in cluster.running.values():
        end = job.end()
        for p in job.placements:
            ends.setdefault(p.node, []).append((end, p.cpus, p.slots, p.gpu_share))
    allowed = set(head.models) if head.models else None
    by_model: dict[int, list[tuple[float, int]]] = {}
    for node in range(len(placer.names)):
        model = int(placer.model[node])
        if allowed is not None and placer.model_names[model] not in allowed:
            continue
        if placer.gpu_count[node] < head.gpus or placer.cpu_total[node] < head.cpus - EPS:
            continue
        when = _fits_at(placer.gpu_free[node].copy(), float(placer.cpu_free[node]), head,
                        sorted(ends.get(node, [])), now)
        if math.isfinite(when):
            by_model.setdefault(model, []).append((when, node))
    best = Reservation(head.id, math.inf, ())
    for times in by_model.values():
        if len(times) < head.parts:
            continue
        times.sort()
        chosen = times[: head.parts]
        shadow = chosen[-1][0]
        if shadow < best.shadow:
            best = Reservation(head.id, shadow, tuple(n for _, n in chosen))
    return best


def _fits_at(row: np.ndarray, cpu: float, head: Job, ends: list, now: float) -> float:
    """When ``head``'s part fits a node whose free shares are ``row``, as its jobs end."""
    free = [float(x) for x in row]
    need = 1.0 if head.share >= 1.0 - EPS else head.share

    def fits() -> bool:
        return cpu >= head.cpus - EPS and (
            head.gpus == 0 or sum(1 for x in free if x >= need - EPS) >= head.gpus)

    if fits():
        return now
    for end, cpus, slots, share in ends:
        cpu += cpus
        for s in slots:
            free[s] += share
        if fits():
            return max(end, now)
    return math.inf


__all__ = ["MODES", "Queue", "Reservation", "Scheduler", "order_key", "reserve", "reserve_per_node"]
