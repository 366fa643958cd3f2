"""The queue and the scheduler's passes: FIFO with backfill per partition (as Slurm), or per-pod
retry (as Kubernetes).

Order: high-priority jobs before spot ones, then by submit time (an evicted job
keeps its place: it was submitted when it was). A pass runs after every batch of
events at one instant.

- ``fifo`` (Slurm's main scheduler and ``sched/backfill`` in their simplest form,
  one partition per GPU model, as the simulated fleets' pools and most GPU sites):
  jobs start in order while they fit. A job that does not fit blocks the partitions
  it was tried in: it is their head, and later jobs of those partitions do not start
  in order (Slurm's main scheduler skips a partition once its top job cannot start;
  other partitions go on). A job may use every model it fits (its partitions); it is
  tried in those not yet blocked, and if it fits none, it heads each of them: a job of
  several partitions blocks only where it was tried. A job whose partitions are all
  blocked is a backfill candidate: each head it waits behind gets a reservation, the
  nodes it could start on soonest and when (the shadow time), computed from the running
  jobs' ends (their true durations at their GPU model's speed: every job's time limit
  is exact). Up to ``backfill_depth`` candidates (Slurm's ``bf_max_job_test``) may start
  out of order if they fit off the reserved nodes, or on reserved nodes where they would
  end by that head's shadow time, at the speed of the reserved nodes' model.
- ``fifo-one-head``: the same with the whole fleet as one partition: the first job
  that does not fit stops every later one but the backfill candidates (the scheduler
  before per-partition heads; kept for comparison).
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
from exporter.outcome_sim.free_counts import share_needed
from exporter.outcome_sim.timeline import Job

MODES = ("fifo", "fifo-one-head", "kube")
NO_ROOM_KEPT = 4096  # queries Scheduler._no_room keeps before it starts over
FIT_ASKS_KEPT = 256  # part shapes FitTimes keeps per node before it starts over
RECHECKED = 16  # changes since a query found no room that are read one by one; more: asked afresh


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


@dataclass(frozen=True, slots=True)
class Ahead:
    """The reservations a backfill candidate waits behind."""

    off: tuple  # (releases, the reservations' numbers): names them, for what failed off them
    reserved: tuple[int, ...]  # their nodes
    shadows: tuple[tuple[float, float, tuple[int, ...]], ...]  # (shadow, model speed, nodes) each


@dataclass
class Scheduler:
    cluster: Cluster
    mode: str = "fifo"
    backfill_depth: int = 100
    queue: Queue = field(default_factory=Queue)
    rejected: list[Job] = field(default_factory=list)
    reservation: Reservation | None = None  # the first blocked head's, once a job behind it was tried
    blocked: Job | None = None  # the first head after the last pass, if it could not start
    heads: tuple[Job, ...] = ()  # every blocked head after the last pass, in queue order
    head_of: dict[int, Job] = field(default_factory=dict)  # partition -> its blocked head, after the pass
    # head id -> its reservation, made in the last pass (for the heads a candidate waited behind)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    _failed: dict[tuple, int] = field(default_factory=dict)  # shape -> releases when it fit nowhere
    # (shape, partitions) -> releases when it fit in none of those partitions
    _failed_in: dict[tuple, int] = field(default_factory=dict)
    _fits_empty: dict[tuple, bool] = field(default_factory=dict)
    _partitions: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # shape -> its partitions
    # shape -> (releases, reservations) when it fit nowhere off those reservations' nodes
    _failed_off: dict[tuple, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # job id -> the reservations (Ahead.off) it could not backfill behind: while they hold and
    # nothing came back, it still cannot (time only makes it later against their shadows)
    _no_backfill: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    _exclusions: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict)  # nodes as an index
    # (shape, excluded nodes, partitions) -> the placer's clock when :meth:`_find` last saw no room
    # for it: a node's room is its own row's, so while no node changed since has room for a part,
    # there is none again (:meth:`_still_no_room`); most backfill tries after a release are so
    _no_room: dict[tuple, int] = field(default_factory=dict)
    _fit_times: FitTimes = field(default_factory=lambda: FitTimes())
    _disturbed: int = 0  # moves and evictions so far: a reservation from before may be stale
    _reservations: int = 0  # reservations made so far: one in force is told by its number
    # head id -> (reservation, its number, _disturbed when made, the partitions it was made for)
    _held: dict[int, tuple[Reservation, int, int, tuple[int, ...]]] = field(default_factory=dict)
    _model_masks: dict[tuple, np.ndarray] = field(default_factory=dict)  # nodes of these models
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
        """Running jobs moved: the heads' reservations are recomputed at the next pass."""
        self._disturbed += 1

    def partitions(self, job: Job) -> tuple[int, ...]:
        """The partitions ``job`` is submitted to: the GPU models (the placer's indices) it may
        use and that have enough nodes big enough for it, empty or not (a partition it could
        never start in is not one Slurm would keep it in). ``fifo-one-head``: the one
        partition 0. A job asking no GPU is in none: it never blocks, nor waits for, a head."""
        if self.mode == "fifo-one-head":
            return (0,)
        key = job.shape_key
        found = self._partitions.get(key)
        if found is None:
            placer = self.cluster.placer
            if not job.gpus:
                found = ()
            else:
                big = (placer.gpu_count >= job.gpus) & (placer.cpu_total >= job.cpus - EPS)
                counts = np.bincount(placer.model[big], minlength=len(placer.model_names))
                found = tuple(m for m, name in enumerate(placer.model_names)
                              if counts[m] >= job.parts and (not job.models or name in job.models))
            self._partitions[key] = found
        return found

    def run_pass(self, now: float) -> list[Job]:
        """Start what may start now; the jobs started."""
        cluster = self.cluster
        token = (cluster.releases, self.queue.added, self._disturbed)
        if token == self._last_pass:
            return []  # nothing came back, nothing arrived, nothing moved: what waited still waits
        started = self._kube_pass(now) if self.mode == "kube" else self._fifo_pass(now)
        for job in started:
            self.queue.remove(job)
        if self.mode == "kube":
            self.blocked = self.queue.head()
        self._last_pass = (cluster.releases, self.queue.added, self._disturbed)
        return started

    def _kube_pass(self, now: float) -> list[Job]:
        cluster = self.cluster
        started: list[Job] = []
        releases = cluster.releases  # no start in the pass changes it: what fit nowhere still does
        failed = self._failed
        walk = self.queue.ordered()
        job = next(walk, None)
        while job is not None:
            key = job.shape_key
            skip = True
            if failed.get(key) != releases:
                placed = self._find(job)
                if placed is None:
                    failed[key] = releases
                else:
                    cluster.start(job, placed, now)
                    started.append(job)
                    skip = False
            try:
                job = walk.send(skip)
            except StopIteration:
                job = None
        return started

    def _fifo_pass(self, now: float) -> list[Job]:
        cluster = self.cluster
        started: list[Job] = []
        releases = cluster.releases  # no start in the pass changes it: what fit nowhere still does
        failed, failed_in = self._failed, self._failed_in
        depth = self.backfill_depth
        partitions = 1 if self.mode == "fifo-one-head" else len(cluster.placer.model_names)
        heads: dict[int, Job] = {}  # partition -> its blocked head
        order: list[Job] = []  # the heads, in queue order
        blocks: dict[int, tuple[int, tuple[int, ...]]] = {}  # head id -> (fresh, partitions it blocks)
        started_in: set[int] = set()  # partitions where a job started in order in this pass
        made: dict[int, tuple[Reservation, int]] = {}  # head id -> (reservation, number) in force
        # a candidate's partitions -> the reservations of the heads it waits behind (:meth:`_ahead`)
        behind: dict[tuple[int, ...], Ahead] = {}
        examined = 0
        known = self._partitions if self.mode == "fifo" else None  # shape -> partitions, once computed
        walk = self.queue.ordered()
        job = next(walk, None)
        while job is not None:
            key = job.shape_key
            parts = known.get(key) if known is not None else None
            if parts is None:
                parts = self.partitions(job)
            free: tuple[int, ...]
            if len(parts) == 1:  # most jobs: one partition, no tuple built
                free = () if parts[0] in heads else parts
            else:
                free = tuple(p for p in parts if p not in heads)
            skip = False
            placed = None
            if free or not parts:  # the main scheduler: tried in the partitions not blocked yet
                if failed.get(key) == releases:
                    skip = True  # nothing came back since it fit nowhere: the whole group waits
                elif len(free) == len(parts):
                    placed = self._find(job)
                    if placed is None:
                        failed[key] = releases
                        skip = True
                elif failed_in.get((key, free)) != releases:
                    placed = self._find(job, models=free)
                    if placed is None:
                        failed_in[(key, free)] = releases
                if placed is not None:
                    if partitions > 1:
                        started_in.add(int(cluster.placer.model[placed[0].node]))
                elif free:
                    for p in free:
                        heads[p] = job
                    # started in order in one of them earlier in this pass: a held reservation is stale
                    blocks[job.id] = (int(not started_in.isdisjoint(free)), free)
                    order.append(job)
            elif failed.get(key) == releases:
                skip = True
            elif examined >= depth:
                if len(heads) >= partitions:
                    break  # every partition blocked, and no candidate left to try
                skip = True  # its group's later jobs are candidates too: none is tried
            else:
                examined += 1
                ahead = behind.get(parts)
                if ahead is None:  # its partitions' heads do not change in the pass: once per partitions
                    ahead = behind[parts] = self._ahead(parts, heads, blocks, made, now)
                placed = self._backfill(job, ahead, now)
            if placed is not None:
                cluster.start(job, placed, now)
                started.append(job)
            try:
                job = walk.send(skip)
            except StopIteration:
                job = None
        self.heads = tuple(order)
        self.head_of = heads
        self.blocked = order[0] if order else None
        self.reservations = {head: r for head, (r, _) in made.items()}
        held = {j.id: self._held[j.id] for j in order if j.id in self._held}
        self._held = held
        first = held.get(self.blocked.id) if self.blocked is not None else None
        self.reservation = first[0] if first is not None else None
        return started

    def _ahead(self, parts: tuple[int, ...], heads: dict[int, Job],
               blocks: dict[int, tuple[int, tuple[int, ...]]],
               made: dict[int, tuple[Reservation, int]], now: float) -> Ahead:
        """What a candidate of ``parts`` waits behind: its heads' reservations."""
        cluster = self.cluster
        ahead = list({heads[p].id: heads[p] for p in parts}.values())
        held = [self._reserve(head, blocks[head.id], made, now) for head in ahead]
        off = (cluster.releases, tuple(sorted(number for _, number in held)))
        reserved = tuple(sorted({n for r, _ in held for n in r.nodes}))
        # (shadow, speed of the reserved nodes' model, nodes) of each reservation that holds nodes
        shadows = tuple((r.shadow, cluster.speeds[int(cluster.placer.model[r.nodes[0]])], r.nodes)
                        for r, _ in held if r.nodes)
        return Ahead(off, reserved, shadows)

    def _backfill(self, job: Job, ahead: Ahead, now: float) -> list | None:
        """Where a candidate behind blocked heads may start now, leaving their reservations alone:
        off their reserved nodes, or on those of a head whose shadow time it ends by, its run
        at the speed of their GPU model (after restoring a checkpoint, if it has one)."""
        if self._no_backfill.get(job.id) == ahead.off:
            return None
        key = job.shape_key
        placed = None
        # it failed off these reserved nodes, and nothing came back since: it still does
        if self._failed_off.get(key) != ahead.off:
            placed = self._find(job, ahead.reserved)
            if placed is None:
                self._failed_off[key] = ahead.off
                if not ahead.reserved:
                    self._failed[key] = ahead.off[0]
        if placed is None and ahead.shadows:
            start = now + (self.cluster.cost.restore if job.restore_due else 0.0)
            left = job.work - job.done
            late = [nodes for shadow, speed, nodes in ahead.shadows if start + left / speed > shadow]
            if not late:
                placed = self._find(job)
                if placed is None:
                    self._failed[key] = ahead.off[0]
            elif len(late) < len(ahead.shadows):
                placed = self._find(job, tuple(sorted({n for nodes in late for n in nodes})))
        if placed is None:
            # the same reservations and no release: the same failure at any later instant (its
            # end only moves later past their shadows, and starts only take room)
            self._no_backfill[job.id] = ahead.off
        return placed

    def _find(self, job: Job, exclude: tuple[int, ...] = (), models: tuple[int, ...] = ()) -> list | None:
        """``cluster.find``, asked only when the job could fit: a model it may use (of ``models``,
        the placer's indices, if given) has, off ``exclude``, as many nodes with room for a part
        as it has parts. Without that, the placer would try a gang part by part, model by model,
        over the whole fleet, and fail (on the GFS fleet a many-worker gang was tried so at every
        pass)."""
        placer = self.cluster.placer
        query = (job.shape_key, exclude, models)
        seen = self._no_room.get(query)
        if seen is not None and self._still_no_room(job, seen):
            self._no_room[query] = placer.changes
            return None
        names = self._model_names(job, models)
        if not self._has_room(job, exclude, names):
            if len(self._no_room) >= NO_ROOM_KEPT:
                self._no_room.clear()
            self._no_room[query] = placer.changes
            return None
        rank = self.steer(job) if self.steer is not None else None
        if rank is None:
            return self.cluster.find(job, exclude=exclude, models=names)
        before, placer.preference = placer.preference, rank
        try:
            return self.cluster.find(job, exclude=exclude, models=names)
        finally:
            placer.preference = before

    def _model_names(self, job: Job, models: tuple[int, ...]) -> tuple[str, ...] | None:
        """The names of ``models`` (the placer's indices) for a job that asks GPUs; None: the
        job's own models (a CPU-only job is kept to no model)."""
        if models and job.gpus:
            return tuple(self.cluster.placer.model_names[m] for m in models)
        return None

    def _still_no_room(self, job: Job, seen: int) -> bool:
        """Whether no node that changed since the placer's clock ``seen`` has room for a part of
        ``job`` (free cores and GPUs, whatever its model): then the nodes with room now are
        among those that had it at ``seen``, unchanged, and :meth:`_has_room` finds none again."""
        placer = self.cluster.placer
        changed = placer.changed_since(seen)
        if changed is None or len(changed) > RECHECKED:
            return False
        if not changed:
            return True
        cpus = job.cpus - EPS
        counts = self._free_counts(job.share) if job.gpus else None
        for node in changed:
            if placer.cpu_free[node] >= cpus and (counts is None or counts[node] >= job.gpus):
                return False
        return True

    def _free_counts(self, share: float) -> np.ndarray:
        """Per node, its GPUs with ``share`` free (a whole one for a whole-GPU job), now."""
        return self.cluster.free.counts(share_needed(share))  # kept while nothing changed

    def _has_room(self, job: Job, exclude: tuple[int, ...], names: tuple[str, ...] | None) -> bool:
        """Whether enough nodes of one model (of ``names``, if given, else the job's own) have,
        off ``exclude``, room for a part of ``job`` for all its parts."""
        placer = self.cluster.placer
        room = placer.cpu_free >= job.cpus - EPS
        if job.gpus:
            room &= self._free_counts(job.share) >= job.gpus
        if (names or job.models) and job.gpus:  # the placer keeps a CPU-only job to no model
            mask_key = names if names else job.models
            allowed = self._model_masks.get(mask_key)
            if allowed is None:
                ids = [i for i, m in enumerate(placer.model_names) if m in mask_key]
                allowed = self._model_masks[mask_key] = np.isin(placer.model, ids)
            room &= allowed
        if exclude:
            index = self._exclusions.get(exclude)
            if index is None:
                if len(self._exclusions) > 64:
                    self._exclusions.clear()
                index = self._exclusions[exclude] = np.array(exclude, dtype=np.intp)
            room[index] = False
        if job.parts == 1:
            return bool(room.any())
        return bool(np.bincount(placer.model[room], minlength=len(placer.model_names)).max(initial=0)
                    >= job.parts)

    def _reserve(self, head: Job, blocks: tuple[int, tuple[int, ...]],
                 made: dict[int, tuple[Reservation, int]], now: float) -> tuple[Reservation, int]:
        """The head's reservation in the partitions it blocks, and its number: the one made in an
        earlier pass while nothing moved and nothing started ahead of it there, else a new one."""
        got = made.get(head.id)
        if got is not None:
            return got
        fresh, partitions = blocks
        held = self._held.get(head.id)
        if held is not None and not fresh and held[2] == self._disturbed and held[3] == partitions:
            got = made[head.id] = (held[0], held[1])
            return got
        models = None
        if partitions != self.partitions(head):
            names = self.cluster.placer.model_names
            models = tuple(names[p] for p in partitions)
        reservation = reserve(self.cluster, head, now, models, self._fit_times)
        # by number, not id(): a freed reservation's address is reused by a later one, which
        # then passed for it and kept jobs off nodes it no longer reserved
        self._reservations += 1
        self._held[head.id] = (reservation, self._reservations, self._disturbed, partitions)
        got = made[head.id] = (reservation, self._reservations)
        return got


@dataclass
class FitTimes:
    """Per part a head asks for (cores, GPUs, the share each must have free) and per node, the
    end of a running job at which the part fits there as its jobs end (:func:`fit_end`), kept
    while the node is unchanged: a job's end changes only where it starts, moves or stops, and
    each of those changes the rows of its nodes (``Placer.version``). A reservation reads the
    few nodes that changed since the last one instead of every running job."""

    _by_ask: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def ends(self, cluster: Cluster, cpus: float, gpus: int, need: float, nodes: np.ndarray) -> np.ndarray:
        placer = cluster.placer
        key = (cpus, gpus, need)
        kept = self._by_ask.get(key)
        if kept is None:
            if len(self._by_ask) >= FIT_ASKS_KEPT:
                self._by_ask.clear()
            size = len(placer.names)
            kept = self._by_ask[key] = (np.full(size, -1, dtype=np.int64), np.zeros(size))
        seen, ends = kept
        stale = nodes[seen[nodes] != placer.version[nodes]]
        for node in stale.tolist():
            ends[node] = fit_end(cluster, node, cpus, gpus, need)
        seen[stale] = placer.version[stale]
        return ends[nodes]


def fit_end(cluster: Cluster, node: int, cpus: float, gpus: int, need: float) -> float:
    """The end of a running job on ``node`` after which a part of ``cpus`` cores and ``gpus``
    GPUs with ``need`` free fits there, its jobs ending in time order: -inf if it fits now, inf
    if it never does. Ties in time are taken in ``running``'s order, as a scan of it meets the
    parts: the free shares add up in that order, to the bit."""
    placer = cluster.placer
    free = placer.gpu_free[node].tolist()
    cpu = float(placer.cpu_free[node])

    def fits() -> bool:
        return cpu >= cpus - EPS and (gpus == 0 or sum(1 for x in free if x >= need - EPS) >= gpus)

    if fits():
        return -math.inf
    order = cluster.entered
    ends = sorted(((job.end(), order[job.id], k, p) for job in cluster.parts_on.get(node, {}).values()
                   for k, p in enumerate(job.placements) if p.node == node), key=itemgetter(0, 1, 2))
    for end, _, _, p in ends:
        cpu += p.cpus
        for s in p.slots:
            free[s] += p.gpu_share
        if fits():
            return end
    return math.inf


def reserve(cluster: Cluster, head: Job, now: float, models: tuple[str, ...] | None = None,
            fit_times: FitTimes | None = None) -> Reservation:
    """The nodes ``head`` could start on soonest, and when, if the running jobs end as planned
    (each at its GPU model's speed: :meth:`Job.end`). ``models``: the GPU models it may start
    on here (the partitions it heads); None: all it may use.

    Per node: its free GPUs and cores, plus what its jobs give back as they end,
    earliest first, until the head's part fits (:func:`fit_end`; ``fit_times`` keeps them
    per node while the node is unchanged). A gang needs ``parts`` such nodes of one model:
    the latest of the model's ``parts`` soonest nodes, the best model (on a tie, the model of
    the lowest-numbered node that could take a part); within a model, the soonest nodes, by
    number on a tie. What :func:`reserve_per_node` finds (a test holds the two equal).
    """
    placer = cluster.placer
    need = 1.0 if head.share >= 1.0 - EPS else head.share
    eligible = (placer.gpu_count >= head.gpus) & (placer.cpu_total >= head.cpus - EPS)
    if models is None:
        models = head.models
    if models:
        allowed = [i for i, m in enumerate(placer.model_names) if m in models]
        eligible &= np.isin(placer.model, allowed)
    nodes = np.flatnonzero(eligible)
    best = Reservation(head.id, math.inf, ())
    if not len(nodes):
        return best
    if fit_times is None:
        ends = np.array([fit_end(cluster, n, head.cpus, head.gpus, need) for n in nodes.tolist()])
    else:
        ends = fit_times.ends(cluster, head.cpus, head.gpus, need, nodes)
    at = np.maximum(ends, now)  # when each node could take a part; inf: never
    soon = np.isfinite(at)
    node_model = placer.model[nodes]
    firsts = np.unique(node_model, return_index=True)[1]
    for model in node_model[np.sort(firsts)].tolist():  # models in the order of their first node
        mine = soon & (node_model == model)
        if np.count_nonzero(mine) < head.parts:
            continue
        times, where = at[mine], nodes[mine]
        chosen = np.lexsort((where, times))[: head.parts]
        shadow = float(times[chosen[-1]])
        if shadow < best.shadow:
            best = Reservation(head.id, shadow, tuple(int(n) for n in where[chosen]))
    return best


def reserve_per_node(cluster: Cluster, head: Job, now: float,
                     models: tuple[str, ...] | None = None) -> Reservation:
    """:func:`reserve` node by node: each node's own ends until the head fits. The reference the
    sweep is tested against (and what it was before)."""
    placer = cluster.placer
    ends: dict[int, list[tuple[float, float, tuple[int, ...], float]]] = {}
    for job in cluster.running.values():
        end = job.end()
        for p in job.placements:
            ends.setdefault(p.node, []).append((end, p.cpus, p.slots, p.gpu_share))
    if models is None:
        models = head.models
    allowed = set(models) if models else None
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


__all__ = ["MODES", "FitTimes", "Queue", "Reservation", "Scheduler", "fit_end", "order_key", "reserve",
           "reserve_per_node"]
