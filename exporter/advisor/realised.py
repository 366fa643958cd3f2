"""The saving a plan is expected to make, measured against the oracle's bound, and the saving
it made, read from the snapshots that follow.

- :func:`oracle_waiting_saved`: an upper bound on the GPU-hours of waiting a free, perfect
  repack of the fleet could save now, in the planner's units (each job started: its GPUs
  times its wait so far). A plan's ``share_of_oracle_saving`` is its expected saving over it.
- :class:`Ledger`: each delivered plan, its jobs watched in the snapshots that follow: a job
  seen running started (at its allocation's start time where the source states one); the
  GPU-hours saved are its GPUs times the wait it was expected to save less the delay before
  it started. Bounded: the newest :data:`KEEP` plans, each watched for at most
  :data:`WATCH_MAX` seconds, and totals over those closed.

docs/advisor.md, "Expected and realised saving", says what each figure means and what it
cannot see.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from exporter.advisor.plan import CompactionPlan
from exporter.advisor.planner import PENDING_CHECKED, blocked_pending, mig_nodes, pending_task
from exporter.advisor.saving import JobOutcome, PlanOutcome, RealisedTotals, Saving
from exporter.analysis.index import Report
from exporter.placement.engine import Placer
from exporter.snapshot import FleetSnapshot, JobRequest

KEEP = 32  # delivered plans listed in /v1/advice (the totals count every closed one)
WATCH_MAX = 86_400.0  # seconds a plan's jobs are watched at most


def _shape(job: JobRequest) -> tuple:
    # the planner checks each shape of the queue once (planner.blocked_pending): a job of a
    # shape it found blocked is blocked too
    return (job.gpu_count, job.gpu_share, job.cpus, job.node_count, tuple(job.models), job.pool)


def _waited(job: JobRequest, now: float) -> float:
    return 0.0 if job.submit_time is None else max(0.0, now - job.submit_time)


def oracle_waiting_saved(snapshot: FleetSnapshot, report: Report, now: float) -> float:
    """GPU-hours of waiting that no repack can beat, for the pending jobs blocked now.

    The jobs: the first :data:`~exporter.advisor.planner.PENDING_CHECKED` pending jobs whose
    shape fits nowhere as the fleet is (the planner's own test); each is worth its GPUs
    times its wait so far, as the planner values a job it lets start. A job counts only if
    the nodes it may use (its pool, its models, no MIG node, enough GPUs for one part, as
    many nodes as parts) could hold it were they empty. The room: the free GPUs (shares
    summed) of its pool, or of the whole fleet when any such job names no pool: moves never
    cross pools, so a pool's free GPUs are all any repack can give its jobs. The bound is the
    fractional knapsack of the jobs into that room, most GPU-hours per GPU first, which no
    set of jobs started together, after any moves, exceeds (it ignores CPUs, node borders
    and models within the room). Rounded to 3 places, as the plans' savings are.
    """
    if not snapshot.pending:
        return 0.0
    state = report.state
    if len(state.names) == 0:
        return 0.0
    mig = mig_nodes(snapshot)
    is_mig = np.array([name in mig for name in state.names], dtype=bool)
    blocked = {_shape(p.job) for p in blocked_pending(Placer(state, None), state, snapshot.pending, is_mig)}
    if not blocked:
        return 0.0
    free = state.gpu_free.sum(axis=1)
    models = np.array(state.model_names, dtype=object)[state.model] if len(state.model_names) else None
    items: list[tuple[str | None, float, float]] = []  # (pool or None, GPUs taken, GPU-hours)
    for job in itertools.islice(snapshot.pending, PENDING_CHECKED):
        if _shape(job) not in blocked:
            continue
        made = pending_task(job)
        value = job.gpu_count * job.gpu_share * _waited(job, now) / 3600
        if made is None or value <= 0:
            continue
        task, parts = made
        allowed = ~is_mig & (state.gpu_count >= task.gpus)
        if task.models and models is not None:
            allowed &= np.isin(models, task.models)
        pool = job.pool if job.pool in state.pool_names else None
        if pool is not None:
            allowed &= state.pool == state.pool_names.index(pool)
        demand = parts * task.gpu_demand
        if int(allowed.sum()) < parts or float(state.gpu_count[allowed].sum()) < demand - 1e-9:
            continue  # no repack of these nodes could hold it
        items.append((pool, demand, value))
    rooms: dict[str | None, float] = {}
    if any(pool is None for pool, _, _ in items):
        items = [(None, demand, value) for _, demand, value in items]
        rooms[None] = float(free[~is_mig].sum())
    else:
        for pool in {pool for pool, _, _ in items}:
            assert pool is not None
            rooms[pool] = float(free[~is_mig & (state.pool == state.pool_names.index(pool))].sum())
    bound = 0.0
    for pool, room in rooms.items():
        for _, demand, value in sorted((i for i in items if i[0] == pool), key=lambda i: -i[2] / i[1]):
            if room <= 1e-9:
                break
            take = min(1.0, room / demand)
            bound += take * value
            room -= take * demand
    return round(bound, 3)


def with_oracle(plan: CompactionPlan | None, oracle: float | None) -> CompactionPlan | None:
    """``plan`` carrying the oracle's bound of its snapshot."""
    return None if plan is None else dataclasses.replace(plan, oracle_gpu_hours_waiting_saved=oracle)


def _job_outcome(job: JobOutcome, started_at: float, proposed_at: float) -> JobOutcome:
    delay = max(0.0, started_at - proposed_at)
    realised = job.gpus * max(0.0, job.waited - delay) / 3600
    return dataclasses.replace(job, started_at=started_at, realised=round(realised, 3))


@dataclass
class Ledger:
    """The delivered plans and what came of them; held by whoever runs the advisor (the
    serving cycle's planner, a simulation's), updated by :func:`~exporter.advisor.advise.advise`
    on every evaluation, so it sees each snapshot once and each plan when proposed."""

    keep: int = KEEP
    watch_max: float = WATCH_MAX
    plans: deque[PlanOutcome] = field(default_factory=deque)
    totals: RealisedTotals = field(default_factory=RealisedTotals)

    def record(self, plan: CompactionPlan, snapshot: FleetSnapshot, now: float) -> None:
        """A plan just proposed, its jobs as the queue of ``snapshot`` states them. A plan
        proposed again while watched (the outbox could not take it) is not recorded twice."""
        plan_id = plan.plan_id
        if any(p.plan_id == plan_id and not p.closed for p in self.plans):
            return
        wanted = set(plan.lets_start)
        requests = {j.job: j for j in snapshot.pending if j.job in wanted}
        jobs = []
        for name in plan.lets_start:
            request = requests.get(name)
            gpus = 0.0 if request is None else request.gpu_count * request.gpu_share
            waited = 0.0 if request is None else _waited(request, now)
            jobs.append(JobOutcome(name, gpus, waited, round(gpus * waited / 3600, 3), None, None))
        watch = max(plan.expires_at - now, max((j.waited for j in jobs), default=0.0))
        self.plans.append(PlanOutcome(plan_id, now, now + min(self.watch_max, max(0.0, watch)),
                                      plan.gpu_hours_waiting_saved, plan.oracle_gpu_hours_waiting_saved,
                                      tuple(jobs), closed=False))
        while len(self.plans) > self.keep:
            dropped = self.plans.popleft()
            if not dropped.closed:  # pushed out while watched: counted as it stands
                self._count(self._closed(dropped))

    def observe(self, snapshot: FleetSnapshot, now: float) -> None:
        """The jobs of the open plans that ``snapshot`` shows running; plans past their watch
        or with every job started are closed and counted."""
        if all(p.closed for p in self.plans):
            return
        waiting = {j.job for p in self.plans if not p.closed for j in p.jobs if j.started_at is None}
        running = {}
        if waiting:
            for alloc in snapshot.allocations:
                if alloc.job in waiting:
                    started = alloc.start_time if alloc.start_time is not None else snapshot.taken_at
                    running[alloc.job] = min(started, snapshot.taken_at)
        for i, outcome in enumerate(self.plans):
            if outcome.closed:
                continue
            jobs = tuple(_job_outcome(j, max(running[j.job], outcome.proposed_at), outcome.proposed_at)
                         if j.started_at is None and j.job in running else j for j in outcome.jobs)
            outcome = dataclasses.replace(outcome, jobs=jobs)
            if now >= outcome.closes_at or all(j.started_at is not None for j in jobs):
                outcome = self._closed(outcome)
                self._count(outcome)
            self.plans[i] = outcome

    @staticmethod
    def _closed(outcome: PlanOutcome) -> PlanOutcome:
        """Closed: a job never seen running saved nothing."""
        jobs = tuple(j if j.realised is not None else dataclasses.replace(j, realised=0.0)
                     for j in outcome.jobs)
        return dataclasses.replace(outcome, jobs=jobs, closed=True)

    def _count(self, outcome: PlanOutcome) -> None:
        t = self.totals
        self.totals = RealisedTotals(
            t.plans + 1, t.jobs + len(outcome.jobs), t.started + outcome.started,
            round(t.expected + outcome.expected, 3), round(t.realised + (outcome.realised or 0.0), 3))

    def saving(self) -> Saving:
        return Saving(tuple(self.plans), self.totals)


def summary(ledger: Ledger) -> str:
    """One line for a run's summary: the plans closed, their expected and realised GPU-hours of
    waiting saved, and the ratio (the open ones not counted)."""
    t = ledger.totals
    ratio = "n/a" if t.ratio is None else f"{t.ratio:.2f}"
    return (f"plans closed {t.plans}: jobs started {t.started}/{t.jobs}, GPU-h of waiting saved "
            f"expected {t.expected:.1f}, realised {t.realised:.1f} (ratio {ratio})")


__all__ = ["KEEP", "WATCH_MAX", "Ledger", "oracle_waiting_saved", "summary", "with_oracle"]
