"""High-priority jobs preempting spot jobs, by the reference cluster's rule.

A queued high-priority job that does not fit may take the GPUs of running spot
jobs. A spot job that has run less than ``exempt`` seconds since its last
(re)start is left alone; an older one loses what it computed since its last
checkpoint, is paused (its GPUs freed) and requeued ahead of new spot jobs
(:func:`~exporter.outcome_sim.scheduler.order_key`), and restores its checkpoint
when it starts again. Which spot jobs go is the rule's choice:

- ``slurm``: Slurm's preempt plugins list the candidates sorted by priority,
  lowest first (``slurm_find_preemptable_jobs``, src/slurmctld/preempt.c;
  ``preempt_youngest_first`` would sort by start time instead, off by default).
  Spot jobs share one priority here, so the order is the job list's: submit
  order. select/cons_tres removes candidates in that order until the job fits,
  and preempts those on the nodes it then allocates.
- ``kube``: the Kubernetes scheduler's default preemption. Per node, every
  lower-priority pod is removed, then pods are reprieved most important first
  (higher priority, then earlier start) while the preemptor still fits; the
  rest are the node's victims. ``pickOneNodeForPreemption`` then takes the node
  with the fewest PDB violations (none here), the lowest highest victim
  priority and priority sum (spot jobs share one), the fewest victims, then the
  latest earliest start among the victims, then the first node.
- ``advisor``: per node, the victims that lose the fewest GPU-hours (the most
  recent checkpoints) while the head fits: every candidate removed, then
  reprieved largest loss first. The node: the fewest GPU-hours lost, then the
  least fragmentation left behind (the node's FGD growth after the head is
  placed), then the fewest victims.

A gang (a spot job on several nodes) is preempted whole: a victim on one node
stops all its parts, and loses the work of all its GPUs (a gang operator restarts
every worker when one is evicted). Only a single-node high-priority job preempts:
a high-priority gang waits (docs/simulate.md says what that biases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.fgd import one_node_fragmentation
from exporter.analysis.state import EPS
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.timeline import Job
from exporter.preemption.quota import QuotaSettings, SpotQuota, spot_quota

PREEMPTIONS = ("none", "slurm", "kube", "advisor")
SPOT_QUOTAS = ("none", "advisor", "borrow", "borrow-short", "borrow-fit")
GATE_EVERY = 60.0  # simulated seconds between the quota gate's looks at the fleet
SAMPLE_EVERY = 300.0  # ... and between its samples of the high-priority demand
EXEMPT = 1800.0  # seconds of run since its last (re)start before a spot job may be preempted
# what queued high-priority jobs ask for, tried per instant, in queue order (Slurm's
# default_queue_depth): counted by shape, not by job, since jobs asking the same thing fail
# alike (Slurm skips the rest of a partition whose top job cannot start; the Kubernetes
# scheduler tries every pending pod). Counted by job, the oldest blocked shape (on the GFS
# demand, 8-GPU jobs of one model) filled the depth and no other job ever preempted
HEADS_PER_PASS = 100
PER_SHAPE = 16  # jobs of one shape tried per instant: after a preemption the next may need one


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    victims: tuple[Job, ...]


@dataclass
class Preempter:
    rule: str = "none"
    exempt: float = EXEMPT
    # (when, GPU-seconds lost, job) per victim: the run counts those after its warm-up
    events: list[tuple[float, float, Job]] = field(default_factory=list)
    # ids of the spot jobs admitted beyond their pool's quota (SpotGate with borrowing): they
    # are the first victims, before any job the quota admitted
    borrowed: set[int] = field(default_factory=set)
    _token: tuple | None = None  # the fleet and queue when the last try found nothing
    _until: float = math.inf  # ... and when a spot job next leaves its exemption

    def __post_init__(self) -> None:
        if self.rule not in PREEMPTIONS:
            raise ValueError(f"unknown preemption {self.rule!r}; one of {', '.join(PREEMPTIONS)}")
        if not 0 <= self.exempt <= 30 * 86400:
            raise ValueError(f"exempt must be in [0, 30 days], got {self.exempt}")

    def run(self, cluster: Cluster, scheduler: Scheduler, now: float) -> tuple[list[Job], list[Job]]:
        """Preempt for the queued high-priority jobs that do not fit; (heads started, victims)."""
        if self.rule == "none":
            return [], []
        if _token(cluster, scheduler) == self._token and now < self._until:
            return [], []  # nothing changed and no spot job came of age: the same try fails
        heads: list[Job] = []
        shapes: dict[tuple, int] = {}
        walk = scheduler.queue.ordered()
        job = next(walk, None)
        while job is not None and job.high:
            taken = shapes.get(job.shape_key, 0)
            if taken == 0 and len(shapes) >= HEADS_PER_PASS:
                break
            if job.parts == 1 and job.gpus > 0:
                heads.append(job)
            shapes[job.shape_key] = taken + 1
            try:  # the rest of a shape's group once it has had its turns
                job = walk.send(taken + 1 >= PER_SHAPE)
            except StopIteration:
                job = None
        walk.close()
        started: list[Job] = []
        victims: list[Job] = []
        self._until = math.inf
        failed: set[tuple] = set()  # shapes that found no victims since the last preemption
        for head in heads:
            if head.shape_key in failed:
                continue
            if scheduler._find(head) is not None:
                continue  # it fits now (a later pass starts it): nothing to preempt for
            choice = self.choose(cluster, head, now)
            if choice is None:
                failed.add(head.shape_key)
                continue
            failed.clear()
            for v in choice.victims:
                self.borrowed.discard(v.id)  # requeued: it was admitted, it is no longer lent
                self.pause(cluster, v, now)
                scheduler.requeue(v)
                victims.append(v)
            placement = cluster.placer.place_on(cluster.task(head), choice.node,
                                                cluster.policy if cluster.policy != "random" else "bestfit")
            if placement is None:  # cannot happen: the node was tested with the victims gone
                raise AssertionError(f"job {head.id} does not fit node {choice.node} after preemption")
            scheduler.queue.remove(head)
            cluster.start(head, [placement], now)
            scheduler.disturbed()
            started.append(head)
        self._token = None if started else _token(cluster, scheduler)
        return started, victims

    # -- choosing -------------------------------------------------------------------

    def candidates(self, cluster: Cluster, now: float) -> dict[int, list[Job]]:
        """Running spot jobs past their exemption, by node; notes when the next one comes of age."""
        by_node: dict[int, list[Job]] = {}
        for job in cluster.running.values():
            if job.high or not job.placements:
                continue
            if now - job.placed < self.exempt:
                self._until = min(self._until, job.placed + self.exempt)
                continue
            for p in job.placements:
                by_node.setdefault(p.node, []).append(job)
        return by_node

    def choose(self, cluster: Cluster, head: Job, now: float) -> Choice | None:
        by_node = self.candidates(cluster, now)
        placer = cluster.placer
        allowed = None
        if head.models:
            allowed = {i for i, m in enumerate(placer.model_names) if m in head.models}
        nodes = [n for n in sorted(by_node)
                 if (allowed is None or int(placer.model[n]) in allowed)
                 and placer.gpu_count[n] >= head.gpus and placer.cpu_total[n] >= head.cpus - EPS]
        if self.rule == "slurm":
            return self._slurm(cluster, head, by_node, nodes)
        best: tuple | None = None
        choice = None
        for node in nodes:
            jobs = by_node[node]
            if not fits(cluster, head, node, jobs):
                continue
            lent = self.borrowed
            if self.rule == "kube":
                # most important first: earlier start (spot jobs share one priority); a job lent
                # GPUs beyond the quota is less important than any the quota admitted
                kept = reprieve(cluster, head, node,
                                sorted(jobs, key=lambda j: (j.id in lent, j.placed, j.id)))
                chosen = [j for j in jobs if j not in kept]
                key: tuple = (sum(j.id not in lent for j in chosen), len(chosen),
                              -min(j.placed for j in chosen), node)
            else:
                def loss(j: Job) -> float:
                    return lost_seconds(j, now, cluster.cost.checkpoint) * j.demand
                kept = reprieve(cluster, head, node,
                                sorted(jobs, key=lambda j: (j.id in lent, -loss(j), j.id)))
                chosen = [j for j in jobs if j not in kept]
                # what the quota admitted loses first, then all: the same order without lending
                key = (sum(loss(j) for j in chosen if j.id not in lent), sum(loss(j) for j in chosen),
                       growth(cluster, head, node, chosen), len(chosen), node)
            if best is None or key < best:
                best, choice = key, Choice(node, tuple(sorted(chosen, key=lambda j: j.id)))
        return choice

    def _slurm(self, cluster: Cluster, head: Job, by_node: dict[int, list[Job]],
               nodes: list[int]) -> Choice | None:
        eligible = set(nodes)
        unique = {j.id: j for n in nodes for j in by_node[n]}
        order = sorted(unique.values(), key=lambda j: (j.submit, j.id))
        removed: dict[int, list[Job]] = {}
        for job in order:
            for p in job.placements:
                if p.node not in eligible:
                    continue
                gone = removed.setdefault(p.node, [])
                gone.append(job)
                if fits(cluster, head, p.node, gone):
                    return Choice(p.node, tuple(gone))
        return None

    # -- acting ---------------------------------------------------------------------

    def pause(self, cluster: Cluster, job: Job, now: float) -> float:
        """Checkpoint-restart's cost: keep what the checkpoints saved, lose the rest, free the GPUs,
        restore when it starts again. Returns the GPU-seconds lost (the restore included)."""
        saved, since = job.progress(now, cluster.cost.checkpoint)
        job.done = min(job.work, job.done + saved * job.speed)
        job.restore_due = True
        lost = (since + cluster.cost.restore) * job.demand
        job.lost_gpu_seconds += since * job.demand  # the restore is charged at its restart
        job.preemptions += 1
        job.paused = True
        job.requeued = now
        cluster.stop(job)
        self.events.append((now, lost, job))
        return lost


def _token(cluster: Cluster, scheduler: Scheduler) -> tuple[int, int, int, int]:
    """What a failed try depends on besides the clock: releases, arrivals, moves, running jobs."""
    return (cluster.releases, scheduler.queue.added, scheduler._disturbed, len(cluster.running))


def lost_seconds(job: Job, now: float, checkpoint: float) -> float:
    """Run seconds a preemption now would lose: those since the last checkpoint."""
    return job.progress(now, checkpoint)[1]


def _row(cluster: Cluster, node: int, jobs: list[Job]) -> tuple[np.ndarray, float]:
    placer = cluster.placer
    free = placer.gpu_free[node].copy()
    cpu = float(placer.cpu_free[node])
    for j in jobs:
        for p in j.placements:
            if p.node == node:
                cpu += p.cpus
                free[list(p.slots)] += p.gpu_share
    return free, cpu


def fits(cluster: Cluster, head: Job, node: int, gone: list[Job]) -> bool:
    """Whether ``head`` fits ``node`` once ``gone`` have left it."""
    free, cpu = _row(cluster, node, gone)
    need = 1.0 if head.share >= 1.0 - EPS else head.share
    return cpu >= head.cpus - EPS and int(np.count_nonzero(free >= need - EPS)) >= head.gpus


def reprieve(cluster: Cluster, head: Job, node: int, order: list[Job]) -> list[Job]:
    """Starting with every job of ``order`` gone, take each back, in order, while ``head`` still
    fits: the jobs kept."""
    kept: list[Job] = []
    for job in order:
        gone = [j for j in order if j is not job and j not in kept]
        if fits(cluster, head, node, gone):
            kept.append(job)
    return kept


def growth(cluster: Cluster, head: Job, node: int, gone: list[Job]) -> float:
    """The node's FGD fragmentation after ``gone`` leave and ``head`` takes its GPUs there, less
    before; 0 without a target workload."""
    workload = cluster.workload
    if workload is None:
        return 0.0
    placer = cluster.placer
    model = int(placer.model[node])
    before = one_node_fragmentation(float(placer.cpu_free[node]), placer.gpu_free[node], model, workload)
    free, cpu = _row(cluster, node, gone)
    need = 1.0 if head.share >= 1.0 - EPS else head.share
    # best fit on the node: the fullest GPUs that still take the share
    room = [i for i in np.argsort(free, kind="stable").tolist() if free[i] >= need - EPS][: head.gpus]
    free[room] -= head.share if head.gpus else 0.0
    after = one_node_fragmentation(cpu - head.cpus, free, model, workload)
    return after - before


def counted(preempter: Preempter, since: float) -> list[tuple[float, float, Job]]:
    return [e for e in preempter.events if e[0] >= since]


def fill(out, preempter: Preempter, jobs: list[Job], running: dict[int, Job], since: float,  # type: ignore[no-untyped-def]
         until: float, delivered_gpu_seconds: float) -> None:
    """The preemption columns of ``out``: victims in the window, per 1,000 spot jobs submitted in
    it, the GPU-hours they lost (and over delivered), and spot jobs preempted that had not
    finished by the end."""
    events = counted(preempter, since)
    lost = sum(e[1] for e in events)
    spot = [j for j in jobs if since <= j.submit < until and not j.high]
    out.preemption = preempter.rule
    out.preemptions = len(events)
    out.spot_evictions_per_1000 = 1000.0 * len(events) / len(spot) if spot else 0.0
    out.lost_gpu_hours = lost / 3600
    out.lost_pct = 100.0 * lost / delivered_gpu_seconds if delivered_gpu_seconds > 0 else 0.0
    out.spot_jobs_never_finished = sum(
        1 for j in spot if j.preemptions and (j.id in running or j.requeued is not None))


# -- the spot quota ---------------------------------------------------------------------


@dataclass
class SpotGate:
    """The advisor's spot quota, honoured as an admission gate in front of the scheduler (as
    Kueue admits a workload only under its ClusterQueue's quota, or a Slurm QOS holds a job
    beyond its ``GrpTRES`` with the reason ``QOSGrpGRES``): a new spot job enters the queue only
    while the spot GPUs of its pool (running, plus queued spot jobs already admitted) leave room
    for it under the pool's quota; the others wait in submit order, and a job that does not fit
    its pool's room lets the next one through (Kueue's ``BestEffortFIFO``). A pool is a GPU model;
    a job that may use several counts against the sum of their quotas, and a queued one is
    charged to them in proportion to their GPUs. Preempted spot jobs go back to the queue
    directly: they were admitted.

    Every hour each pool's quota is recomputed from its hourly high-priority demand (GPUs held
    plus GPUs the queued single-node high-priority jobs ask for, sampled every ``SAMPLE_EVERY``
    seconds, the hour's mean, capped at the pool's GPUs):
    :func:`exporter.preemption.quota.spot_quota`. Until the first hour is complete
    no pool has a quota (every spot job is admitted).

    With ``borrow`` the quota is work-conserving, as Kueue's borrowing of unused quota: a spot
    job beyond its pool's quota is admitted too while none of its pools has a single-node
    high-priority job queued (the jobs that preempt), since it then takes GPUs no
    high-priority job is waiting for. Its id goes in ``lent``, which the preempter reads: those
    jobs are its first victims when high-priority demand comes, before any job the quota
    admitted. With ``short`` set, a spot job whose run, on the slowest model it may use, is
    at most ``short`` seconds is lent GPUs whatever waits: set to the preemption's exemption, it
    finishes before it may be preempted. Its run is read from the job (as from an exact time
    limit): what a site knows only from its users' limits, which run long.

    With ``fit`` the lending asks more than whether a high-priority job is queued: a pool lends
    unless one of its queued single-node high-priority jobs could start there by preempting,
    i.e. fits one node of the pool in the GPUs and CPUs free plus those its spot jobs hold
    (exempt or not: the exemption only delays). A job that fits no node even with every spot
    job gone (it waits for other high-priority jobs to end) preempts no lent job, so the pool
    lends as if nothing waited.

    The quotas are the same with and without lending (the same forecast of the same demand)."""

    settings: QuotaSettings = field(default_factory=QuotaSettings)
    borrow: bool = False
    short: float | None = None  # lend to spot jobs that run at most this long, queue or not
    fit: bool = False  # lend unless a queued high-priority job could start by preempting
    lent: set[int] = field(default_factory=set)  # spot jobs admitted beyond the quota
    held: list[Job] = field(default_factory=list)  # spot jobs beyond the quota, in submit order
    quotas: dict[int, SpotQuota] = field(default_factory=dict)  # by model index
    hourly: dict[int, list[float]] = field(default_factory=dict)  # complete hours' mean demand, by model
    # per quota set: (the last complete hour, model, quota, forecast peak, margin)
    log: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    capacity: np.ndarray | None = None  # GPUs per model
    _sums: np.ndarray | None = None  # the current hour's samples, summed
    _samples: int = 0
    _hour: int = 0
    _next_look: float = -math.inf
    _next_sample: float = -math.inf
    _token: tuple | None = None

    @property
    def name(self) -> str:
        """The ``--spot-quota`` that makes this gate."""
        if not self.borrow:
            return "advisor"
        return "borrow-fit" if self.fit else "borrow" if self.short is None else "borrow-short"

    def hold(self, job: Job) -> bool:
        """Whether ``job`` waits at the gate (a spot job, once quotas exist): it then waits here
        until :meth:`release` admits it."""
        if job.high or not self.quotas:
            return False
        self.held.append(job)
        return True

    def release(self, cluster: Cluster, scheduler: Scheduler, now: float) -> list[Job]:
        """Sample the demand, recompute the quotas on the hour, admit what fits; the jobs queued."""
        placer = cluster.placer
        if self.capacity is None:
            self.capacity = np.bincount(placer.model, weights=placer.gpu_count,
                                        minlength=len(placer.model_names)).astype(float)
        hour = int(now // 3600)
        if hour > self._hour:
            self._close_hours(hour)
        if now >= self._next_sample:
            high = self._by_model(cluster, scheduler, high=True)
            self._sums = high if self._sums is None else self._sums + high
            self._samples += 1
            self._next_sample = now + SAMPLE_EVERY
        if not self.held or now < self._next_look:
            return []
        token = (cluster.releases, scheduler.queue.size, len(self.held), hour)
        if token == self._token:
            return []
        self._next_look = now + GATE_EVERY
        used = self._by_model(cluster, scheduler, high=False)
        waiting: np.ndarray | None = None  # per model: whether lending there may cost an eviction
        admitted: list[Job] = []
        kept: list[Job] = []
        for job in self.held:
            models = self._models(placer, job)
            room = sum(self.quota_of(m) - float(used[m]) for m in models)
            if self.borrow and waiting is None and room < job.demand - EPS:
                waiting = (self._could_preempt(cluster, scheduler) if self.fit
                           else self._high_queued(cluster, scheduler) > EPS)
            lend = room < job.demand - EPS and (
                (waiting is not None and not any(waiting[m] for m in models))
                or (self.short is not None and self._run(cluster, models, job) <= self.short))
            if room >= job.demand - EPS or lend:
                for m, part in self._split(models, job.demand):
                    used[m] += part
                before = scheduler.queue.added
                scheduler.submit(job)
                if scheduler.queue.added > before:
                    admitted.append(job)
                    if lend:
                        self.lent.add(job.id)
            else:
                kept.append(job)
        self.held = kept
        self._token = (cluster.releases, scheduler.queue.size, len(self.held), hour)
        return admitted

    def quota_of(self, model: int) -> float:
        quota = self.quotas.get(model)
        assert self.capacity is not None
        return float(self.capacity[model]) if quota is None else quota.quota_gpus

    def _close_hours(self, hour: int) -> None:
        """The hours before ``hour`` are complete: keep their means (an hour with no sample
        repeats the last), then set every pool's quota from its history."""
        assert self.capacity is not None
        means = self._sums / self._samples if self._sums is not None and self._samples else None
        for _ in range(self._hour, hour):
            for m in range(len(self.capacity)):
                series = self.hourly.setdefault(m, [])
                value = float(means[m]) if means is not None else (series[-1] if series else 0.0)
                series.append(value)
        self._sums, self._samples, self._hour = None, 0, hour
        for m, series in self.hourly.items():
            quota = spot_quota(str(m), float(self.capacity[m]), series, self.settings)
            self.quotas[m] = quota
            self.log.append((hour - 1, m, quota.quota_gpus, quota.high_forecast_gpus, quota.margin_gpus))

    def _models(self, placer, job: Job) -> list[int]:  # type: ignore[no-untyped-def]
        if not job.models:
            return list(range(len(placer.model_names)))
        return [i for i, m in enumerate(placer.model_names) if m in job.models]

    def _split(self, models: list[int], demand: float) -> list[tuple[int, float]]:
        assert self.capacity is not None
        total = float(sum(self.capacity[m] for m in models)) or 1.0
        return [(m, demand * float(self.capacity[m]) / total) for m in models]

    def _run(self, cluster: Cluster, models: list[int], job: Job) -> float:
        """Seconds ``job`` runs on the slowest of ``models``."""
        slowest = min((cluster.speeds[m] for m in models), default=1.0)
        return (job.work - job.done) / slowest if slowest > 0 else math.inf

    def _high_queued(self, cluster: Cluster, scheduler: Scheduler) -> np.ndarray:
        """GPUs the queued single-node high-priority jobs ask for, per model: the jobs that
        would preempt a spot job lent GPUs there."""
        placer = cluster.placer
        out = np.zeros(len(placer.model_names))
        for group in scheduler.queue.groups.values():
            for _, job in group:
                if job.high and job.parts == 1 and job.gpus > 0:
                    for m, part in self._split(self._models(placer, job), job.demand):
                        out[m] += part
        return out

    def _could_preempt(self, cluster: Cluster, scheduler: Scheduler) -> np.ndarray:
        """Per model: whether a queued single-node high-priority job could start on one of its
        nodes by preempting spot jobs (it fits the node's free GPUs and CPUs plus those its spot
        jobs hold). Queued jobs are counted by shape: jobs asking the same fail alike."""
        placer = cluster.placer
        out = np.zeros(len(placer.model_names), dtype=bool)
        heads: list[Job] = []
        for group in scheduler.queue.groups.values():
            head = next((job for _, job in group if job.high), None)
            if head is not None and head.parts == 1 and head.gpus > 0:
                heads.append(head)
        if not heads:
            return out
        free = placer.gpu_free.copy()
        cpu = np.asarray(placer.cpu_free, dtype=float).copy()
        for job in cluster.running.values():
            if not job.high:
                for p in job.placements:
                    free[p.node, list(p.slots)] += p.gpu_share
                    cpu[p.node] += p.cpus
        for head in heads:
            need = 1.0 if head.share >= 1.0 - EPS else head.share
            able = (cpu >= head.cpus - EPS) & (np.count_nonzero(free >= need - EPS, axis=1) >= head.gpus)
            hit = np.zeros(len(out), dtype=bool)
            hit[placer.model[able]] = True
            for m in self._models(placer, head):
                out[m] |= hit[m]
        return out

    def _by_model(self, cluster: Cluster, scheduler: Scheduler, high: bool) -> np.ndarray:
        """GPUs the running jobs of this priority hold per model, plus what the queued ones ask."""
        placer = cluster.placer
        out = np.zeros(len(placer.model_names))
        for job in cluster.running.values():
            if job.high == high:
                for p in job.placements:
                    out[int(placer.model[p.node])] += job.gpus * job.share
        for group in scheduler.queue.groups.values():
            for _, job in group:
                # a queued high-priority gang is not counted: it waits for whole nodes, which
                # no preemption frees (only single-node jobs preempt), and the trace's gangs of
                # up to 332 workers would read as a pool over-subscribed all day
                if job.high == high and not (high and job.parts > 1):
                    for m, part in self._split(self._models(placer, job), job.demand):
                        out[m] += part
        return out


@dataclass(frozen=True, slots=True)
class QuotaFigures:
    quota_pct: float  # the mean quota, summed over pools, over the fleet's GPUs (100: no quota)
    forecast_mae_pct: float | None  # mean over hours of the summed |peak - forecast peak|, of all GPUs
    # of the pool-hours with a quota, those whose high-priority peak rose above forecast + margin:
    # how often the high-priority jobs would need the GPUs the quota gave spot jobs
    breach_pct: float | None


def quota_figures(gate: SpotGate | None, since: float) -> QuotaFigures:
    """What the quotas set from ``since`` were, and how far their forecasts missed, checked
    against the hourly high-priority demand that came (quotas whose hours ended after the run
    are not checked)."""
    if gate is None or gate.capacity is None:
        return QuotaFigures(100.0, None, None)
    capacity = float(gate.capacity.sum()) or 1.0
    first = math.ceil(since / 3600) - 1
    entries = [e for e in gate.log if e[0] >= first]
    if not entries:
        return QuotaFigures(100.0, None, None)
    h = gate.settings.horizon_hours
    quota_by_hour: dict[int, float] = {}
    error_by_hour: dict[int, float] = {}
    breaches = checked = 0
    for t, m, quota, forecast, margin in entries:
        quota_by_hour[t] = quota_by_hour.get(t, 0.0) + quota
        series = gate.hourly.get(m, [])
        if t + h < len(series):
            # the peak the pool could run: the forecast is of demand capped at capacity
            came = min(max(series[t + 1: t + h + 1]), float(gate.capacity[m]))
            error_by_hour[t] = error_by_hour.get(t, 0.0) + abs(came - forecast)
            if quota > EPS:  # a pool with no quota holds no spot GPU for the peak to need
                breaches += came > forecast + margin + EPS
                checked += 1
    mae = 100.0 * float(np.mean(list(error_by_hour.values()))) / capacity if error_by_hour else None
    return QuotaFigures(100.0 * float(np.mean(list(quota_by_hour.values()))) / capacity, mae,
                        100.0 * breaches / checked if checked else None)


def fill_quota(out, gate: SpotGate | None, since: float) -> None:  # type: ignore[no-untyped-def]
    """The quota columns of ``out``."""
    figures = quota_figures(gate, since)
    out.spot_quota = "none" if gate is None else gate.name
    out.spot_quota_pct = figures.quota_pct
    out.high_forecast_mae_pct = figures.forecast_mae_pct
    out.high_forecast_breach_pct = figures.breach_pct


__all__ = ["EXEMPT", "PREEMPTIONS", "SPOT_QUOTAS", "Choice", "Preempter", "QuotaFigures", "SpotGate", "fill",
           "fill_quota", "fits", "growth", "lost_seconds", "quota_figures", "reprieve"]
