"""The advisor in the loop: every call into :mod:`exporter.advisor` goes through this module.

The advisor's API is being retyped (typed advice structs); keeping every call
here means one module to adapt. What it does, every ``interval`` of simulated
time (the advisor's evaluations follow snapshots; see docs/simulate.md for why
not every 5 s collect interval):

1. builds a :class:`~exporter.snapshot.FleetSnapshot` of the simulated fleet:
   its nodes and GPUs, an allocation per running job (its checkpoint stated,
   high-priority jobs at the planner's ``high_priority``), the queue as
   ``pending``;
2. measures it with the serve's :class:`~exporter.analysis.live.LiveAnalyzer`
   (the default config's analysis settings) and asks the serve's
   :class:`~exporter.advisor.engine.Advisor` (the default config's decision and
   plan settings, the planner ``plan_compaction``, the clock simulated);
3. carries out a new plan as a receiver would: each move in order, only if the
   job still sits where the plan says and the destination GPUs are still free;
   ``wait_until`` moves wait (checked every interval) and are dropped when the
   plan expires first; a dropped move is counted, never forced.

Two decision rules, selectable as strategies:

- ``advisor-current``: the advisor's own rule, as ``serve`` runs it (index above the
  trigger for the dwell, cooldown, at least 0.5 fragmented GPUs recovered per move).
- ``advisor`` (revised, issue 28): compaction pays when it lets a queued job start,
  so act only then. A plan the advisor proposes is carried out only if, applied to
  the fleet, it lets a queued job start that could not before; otherwise it is held.
  And when the head of the queue is blocked while the fleet has the room for it in
  fragments, the rule plans for that job: the fewest verified moves after which it
  starts, under the planner's constraints (jobs older than ``min_runtime``, not
  high-priority, single-node, at most ``max_migrations``, the job's own GPU model;
  the cooldown). This part is not yet in :mod:`exporter.advisor`: docs/simulate.md
  says what must move into the engine and the planner to make it the advisor's own.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.placement.engine import Placement
from exporter.simulate.cluster import undo
from exporter.simulate.strategies import HeadUnblocker, movable
from exporter.snapshot import Allocation, FleetSnapshot, JobRequest
from exporter.snapshot import Placement as Part

if TYPE_CHECKING:
    from exporter.simulate.sim import Sim

PENDING_LISTED = 200  # queued jobs put in a snapshot's pending list (a scheduler's pending view)
NAMESPACES = 20  # jobs spread over this many namespaces (the planner budgets moves per namespace)


@dataclass
class _Move:
    job: int
    source: tuple[str, tuple[int, ...]]
    destination: tuple[str, tuple[int, ...]]
    share: float
    cpus: float
    not_before: float
    expires: float


DEMAND_CHECK = 60.0  # the revised rule looks at the queue's head this often (consolidation's cadence)


@dataclass
class AdvisorStrategy:
    """The advisor evaluates every ``evaluate_every``; the revised rule also checks the queue's
    blocked head every :data:`DEMAND_CHECK` (cheap: no snapshot unless a plan is possible)."""

    name: str = "advisor"
    evaluate_every: float = 60.0
    revised: bool = True
    interval: float = field(init=False)
    _next_evaluation: float = 0.0
    _unblocker: HeadUnblocker = field(default_factory=lambda: HeadUnblocker(same_model=True), repr=False)
    _advisor: Any = field(default=None, repr=False)
    _analyzer: Any = field(default=None, repr=False)
    _plan_settings: Any = field(default=None, repr=False)
    _seen: set[str] = field(default_factory=set, repr=False)
    _waiting: list[_Move] = field(default_factory=list, repr=False)
    _now: float = 0.0
    decisions: Counter[str] = field(default_factory=Counter)  # what each evaluation decided
    # job -> (its version and last checkpoint, its allocation): rebuilt only when either changed
    _allocations: dict[int, tuple[tuple[int, float], Allocation]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.interval = min(DEMAND_CHECK, self.evaluate_every) if self.revised else self.evaluate_every

    def same_model(self, keep: bool) -> None:
        """Whether the revised rule's moves for the queue's head keep a job on its GPU model."""
        self._unblocker.same_model = keep

    def _setup(self) -> None:
        from exporter.advisor.advise import decision_settings, plan_settings
        from exporter.advisor.engine import Advisor
        from exporter.advisor.planner import plan_compaction
        from exporter.analysis.live import LiveAnalyzer
        from exporter.config import load

        config = load(None)
        self._analyzer = LiveAnalyzer.from_config(config.analysis)
        self._analyzer.load = None  # the pools' scaling hints: no part of a decision, and costly
        self._plan_settings = plan_settings(config.advisor)
        self._unblocker.max_moves = self._plan_settings.max_migrations
        self._planner = functools.partial(plan_compaction, settings=self._plan_settings)
        self._advisor = Advisor(decision_settings(config.advisor), clock=lambda: self._now)

    def tick(self, sim: Sim, now: float) -> None:
        if self._advisor is None:
            self._setup()
        self._now = now
        self._carry_out_waiting(sim, now)
        if now < self._next_evaluation:
            if self.revised:
                self._unblock_head(sim, now)
            return
        self._next_evaluation = now + self.evaluate_every
        snapshot = snapshot_of(sim, now, self._allocations)
        report = self._analyzer.analyze(snapshot)
        from exporter.advisor.advise import advise

        advice = advise(self._advisor, snapshot, report, self._planner)
        decision = advice.decision
        self.decisions[decision] += 1
        plan = advice.plan
        if decision == "compact" and plan is not None and plan.plan_id not in self._seen:
            self._seen.add(plan.plan_id)
            # the receiver's side: a plan is delivered (durable) as soon as it is proposed
            self._advisor.durable(now)
            moves = [_Move(int(m.job), (m.source.node, m.source.gpus),
                           (m.destination.node, m.destination.gpus), m.gpu_share, m.cpus,
                           m.wait_until or now, plan.expires_at)
                     for m in plan.migrations]
            if not self.revised or lets_a_queued_job_start(sim, moves):
                self._waiting.extend(moves)
                sim.plans += 1
                self._carry_out_waiting(sim, now)
            else:
                self.decisions["held: starts no queued job"] += 1
            return
        if self.revised:
            self._unblock_head(sim, now)

    def _unblock_head(self, sim: Sim, now: float) -> None:
        """The revised rule's own plan: the queue's head is blocked by fragments, not by capacity."""
        min_runtime = self._plan_settings.min_runtime_seconds
        if self._unblocker(sim, now, lambda j: now - (j.start or now) >= min_runtime):
            self.decisions["compact: unblock the head"] += 1

    def _carry_out_waiting(self, sim: Sim, now: float) -> None:
        cluster = sim.cluster
        index = {name: i for i, name in enumerate(cluster.placer.names)}
        keep: list[_Move] = []
        moved = False
        for move in self._waiting:
            if move.expires <= now:
                sim.moves_dropped += 1  # the plan expired before this move could start
                continue
            if move.not_before > now:
                keep.append(move)
                continue
            job = cluster.running.get(move.job)
            if job is None or len(job.placements) != 1 or (
                    job.placements[0].node_name, job.placements[0].gpus) != move.source:
                sim.moves_dropped += 1  # the job ended or moved since the snapshot
                continue
            node = index[move.destination[0]]
            gpus = move.destination[1]
            destination = Placement(node, move.destination[0], gpus, gpus,
                                    move.share if gpus else 0.0, move.cpus)
            placer = cluster.placer
            for p in job.placements:  # its own GPUs count as free to it: a plan may reuse them
                placer.release(p)
            fits = cluster.free_placement(destination)
            for p in job.placements:
                placer.apply(p)
            if not fits:
                sim.moves_dropped += 1
                continue
            cluster.move(job, [destination], now)
            moved = True
        self._waiting = keep
        if moved:
            sim.scheduler.disturbed()


def snapshot_of(sim: Sim, now: float,
                cache: dict[int, tuple[tuple[int, float], Allocation]] | None = None) -> FleetSnapshot:
    """The simulated fleet as a source would report it: allocations and the pending queue.

    ``cache`` keeps each job's allocation while the job neither moved nor checkpointed, so a
    snapshot of a thousand jobs costs a few allocations, not a thousand.
    """
    fleet = sim.fleet
    interval = sim.cluster.cost.checkpoint
    cache = {} if cache is None else cache
    allocations = []
    for job in sim.cluster.running.values():
        key = (job.version, job.last_checkpoint(now, interval))
        held = cache.get(job.id)
        if held is None or held[0] != key:
            held = (key, Allocation(
                job=str(job.id),
                placements=tuple(Part(p.node_name, p.gpus, p.gpu_share if p.gpus else 1.0, p.cpus)
                                 for p in job.placements),
                namespace=f"team-{job.id % NAMESPACES}", pod=f"job-{job.id}",
                priority=1000 if job.high else 0, start_time=job.start,
                last_checkpoint_time=key[1], allowed_models=job.models))
            cache[job.id] = held
        allocations.append(held[1])
    for gone in [k for k in cache if k not in sim.cluster.running]:
        del cache[gone]
    pending = tuple(JobRequest(str(j.id), j.gpus, j.share if j.gpus else 1.0, j.cpus, j.parts, j.models,
                               priority=1000 if j.high else 0, submit_time=j.submit)
                    for j in itertools.islice(sim.scheduler.queue.ordered(), PENDING_LISTED))
    return FleetSnapshot(now, fleet.nodes, fleet.gpus, tuple(allocations), pending)


def lets_a_queued_job_start(sim: Sim, moves: list[_Move]) -> bool:
    """Whether carrying out ``moves`` (those that can start now) lets a blocked queued job start.

    Applied to the placer and undone: the queued jobs tried are the first
    ``PENDING_LISTED`` in queue order, each shape once.
    """
    cluster = sim.cluster
    placer = cluster.placer
    index = {name: i for i, name in enumerate(placer.names)}
    blocked = []
    seen: set[tuple] = set()
    for job in itertools.islice(sim.scheduler.queue.ordered(), PENDING_LISTED):
        if job.shape_key not in seen:
            seen.add(job.shape_key)
            if cluster.find(job) is None:
                blocked.append(job)
    if not blocked:
        return False
    log: list[tuple[str, Placement]] = []
    try:
        for move in moves:
            mover = cluster.running.get(move.job)
            if mover is None or not movable(mover):
                continue
            node = index[move.destination[0]]
            destination = Placement(node, move.destination[0], move.destination[1], move.destination[1],
                                    move.share if move.destination[1] else 0.0, move.cpus)
            for p in mover.placements:
                placer.release(p)
                log.append(("release", p))
            if cluster.free_placement(destination):
                placer.apply(destination)
                log.append(("apply", destination))
            else:  # a receiver would drop this move: the job stays
                for p in mover.placements:
                    placer.apply(p)
                    log.append(("apply", p))
        return any(cluster.find(waiting) is not None for waiting in blocked)
    finally:
        undo(placer, log)


__all__ = ["AdvisorStrategy", "lets_a_queued_job_start", "snapshot_of"]
