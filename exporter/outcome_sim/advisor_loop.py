"""The advisor in the loop: every call into :mod:`exporter.advisor` goes through this module.

What it does at each tick (every ``interval`` of simulated time):

1. builds a :class:`~exporter.snapshot.FleetSnapshot` of the simulated fleet:
   its nodes and GPUs, an allocation per running job (its checkpoint stated,
   high-priority jobs at the planner's ``high_priority``), the queue as
   ``pending``, and a source ``simulate`` that lists the queue (so an empty one
   says that nothing waits);
2. measures it with the serve's :class:`~exporter.analysis.analyzer.LiveAnalyzer`
   (the default config's analysis settings) and asks the serve's
   :class:`~exporter.advisor.engine.Advisor` through
   :func:`~exporter.advisor.advise.advise` (the default config's decision and
   plan settings, the planner both modes, the clock simulated);
3. carries out a new plan as a receiver would: each move in order, only if the
   job still sits where the plan says and the destination GPUs are still free;
   ``wait_until`` moves wait (checked every interval) and are dropped when the
   plan expires first; a dropped move is counted, never forced.

Two decision rules, both the engine's, selectable as strategies:

- ``advisor``: the revised rule (``DecisionSettings.require_pending``, the
  default): a compaction plan must let a pending job start, and a pending job
  blocked by fragments gets :func:`~exporter.advisor.planner.plan_for_pending`'s plan.
- ``advisor-current``: the index rule alone (``require_pending=False``), as
  ``serve`` ran it before issue 28.

Speed: an evaluation (snapshot, analysis, engine, planner) costs about 25 ms of
CPU on the default fleet, so the advisor is evaluated every ``evaluate_every``
(its cadence, as serve's frames: the index, dwell and hold clocks), never between
two. A plan's waiting moves are looked at every tick.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from exporter.analysis.state import FleetState
from exporter.analysis.workload import PartKey, Shape, part_keys, shapes_of
from exporter.outcome_sim.fleets import SimFleet
from exporter.placement.engine import Placement
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, SourceStatus
from exporter.snapshot import Placement as Part

if TYPE_CHECKING:
    from exporter.analysis.analyzer import FleetView
    from exporter.outcome_sim.cluster import Cluster
    from exporter.outcome_sim.sim import Sim
    from exporter.outcome_sim.timeline import Job

PENDING_LISTED = 200  # queued jobs put in a snapshot's pending list (a scheduler's pending view)
NAMESPACES = 20  # jobs spread over this many namespaces (the planner budgets moves per namespace)
TICK = 60.0  # how often the loop looks whether anything the advisor reads changed
PARTITION = "simulated"  # the one partition the simulated scheduler places every job in
# AdvisorStrategy.freedoms: the planner settings an operator may grant (advisor.move_high_priority,
# advisor.max_migrations, advisor.min_runtime), as the oracle's moves have them
FREEDOMS: tuple[tuple[str, Any], ...] = (
    ("move_high_priority", True), ("max_migrations", 64), ("min_runtime_seconds", 0.0))


@dataclass
class _Move:
    job: int
    source: tuple[str, tuple[int, ...]]
    destination: tuple[str, tuple[int, ...]]
    share: float
    cpus: float
    not_before: float
    expires: float


@dataclass
class AdvisorStrategy:
    """The advisor, looked at every :data:`TICK` (or ``evaluate_every``, when shorter) and
    evaluated when what it reads changed or ``evaluate_every`` passed."""

    name: str = "advisor"
    evaluate_every: float = 60.0
    revised: bool = True
    # the planner's rule (PlanSettings.rule): queue; head (the rule before); starts (queue, and
    # no plan that starts fewer jobs than the small ones its room would see before the next one)
    rule: str = "queue"
    # the snapshot lists the nodes as the simulated scheduler uses them, one partition of mixed
    # models (any job may start on any model), so the planner may move a job to another model
    # with as much memory per GPU; False: each model its own pool, as serve's simulated fleet
    # lists them (the planner keeps every job on its model: the rule before 2026-12-05)
    one_partition: bool = True
    # the operator's freedoms the defaults withhold (FREEDOMS): high-priority and young jobs
    # movable, a budget of 64 moves a plan; the oracle's extra saving came from them
    freedoms: bool = False
    interval: float = field(init=False)
    _next_evaluation: float = 0.0
    _advisor: Any = field(default=None, repr=False)
    _stages: tuple[Any, ...] = field(default=(), repr=False)  # serve's analysis and advisor stages
    _sim: Sim | None = field(default=None, repr=False)  # the fleet the evaluation in progress reads
    _seen: set[str] = field(default_factory=set, repr=False)
    _waiting: list[_Move] = field(default_factory=list, repr=False)
    _now: float = 0.0
    decisions: Counter[str] = field(default_factory=Counter)  # what each evaluation decided
    evaluations: int = 0
    _parts: PartCounts = field(default_factory=lambda: PartCounts(), repr=False)
    # the running jobs' allocations, followed from one evaluation to the next by what changed
    _kept: KeptAllocations = field(init=False, repr=False)
    _requests: dict[int, JobRequest] = field(default_factory=dict, repr=False)  # queued job -> request

    def __post_init__(self) -> None:
        self.interval = min(TICK, self.evaluate_every)
        self._kept = KeptAllocations(self._parts)

    def pools(self, one_partition: bool) -> None:
        """Whether the snapshot lists one partition (the default) or a pool per model
        (:attr:`one_partition`)."""
        self.one_partition = one_partition

    def _setup(self) -> None:
        from exporter.advisor.advise import Planner, decision_settings, plan_settings
        from exporter.advisor.engine import Advisor
        from exporter.analysis.analyzer import LiveAnalyzer
        from exporter.config import load
        from exporter.cycle.stages import AdvisorStage, AnalysisStage

        config = load(None)
        analyzer = LiveAnalyzer.from_config(config.analysis)
        settings = dataclasses.replace(decision_settings(config.advisor), require_pending=self.revised)
        self._advisor = Advisor(settings, clock=lambda: self._now)
        planning = dataclasses.replace(plan_settings(config.advisor), rule=self.rule,
                                       starts_horizon_seconds=self.evaluate_every)
        if self.freedoms:
            planning = dataclasses.replace(planning, **dict(FREEDOMS))
        # serve's stages, as serve builds them from the default config (the pools' scaling
        # hints are no part of a decision: no load stage), on the simulated clock
        self._stages = (AnalysisStage(analyzer, self._view),
                        AdvisorStage(self._advisor, Planner(planning)))

    def tick(self, sim: Sim, now: float) -> None:
        if self._advisor is None:
            self._setup()
        self._now = now
        self._carry_out_waiting(sim, now)
        if now < self._next_evaluation:
            return  # the advisor sees the frames serve would make at its cadence, nothing between
        self._next_evaluation = now + self.evaluate_every
        self.evaluations += 1
        from exporter.cycle import run_cycle

        snapshot = snapshot_of(sim, now, self._kept, self.one_partition, self._requests)
        self._sim = sim
        advice = run_cycle(self._stages, snapshot).advice
        assert advice is not None
        decision = advice.decision
        self.decisions[decision] += 1
        plan = advice.plan
        if decision == "compact" and plan is not None and plan.plan_id not in self._seen:
            self._seen.add(plan.plan_id)
            # the receiver's side: a plan is delivered (durable) as soon as it is proposed
            self._advisor.durable(now)
            self._waiting.extend(
                _Move(int(m.job), (m.source.node, m.source.gpus), (m.destination.node, m.destination.gpus),
                      m.gpu_share, m.cpus, m.wait_until or now, plan.expires_at)
                for m in plan.migrations)
            sim.plans += 1
            self._carry_out_waiting(sim, now)

    def _view(self, snapshot: FleetSnapshot) -> FleetView:
        """What the analysis stage would rebuild from ``snapshot``, taken from the scheduler's
        placer, which holds it (a test checks they agree): a third of an evaluation saved.
        With :attr:`one_partition` the placer's pools (a pool per model, what the outcomes'
        index measures) are read as the snapshot's one; the shapes are the ones
        :func:`snapshot_of` kept (:class:`PartCounts`)."""
        from exporter.analysis.analyzer import FleetView

        assert self._sim is not None
        state = self._sim.cluster.placer.state
        if self.one_partition:
            state = one_partition(state)
        return FleetView(state, self._parts.shapes())

    def _carry_out_waiting(self, sim: Sim, now: float) -> None:
        if not self._waiting:
            return
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


class PartCounts:
    """The shapes of a snapshot's allocations, counted as allocations come and go instead of
    by a pass over them all.

    Each distinct part key (:func:`~exporter.analysis.workload.part_keys`) is numbered by its
    canonical shape once; an allocation enters with its place in the snapshot's order (any
    number that grows along it: its index, or :attr:`Cluster.entered <exporter.outcome_sim.
    cluster.Cluster.entered>`) and its parts' numbers. ``snapshot_shapes`` counts shapes in
    the order first met along the allocations (``typical`` breaks ties by it): a shape's
    first is the lowest place among the allocations holding it, then its first index among
    that allocation's parts, so each shape keeps its holders by place and its order is read
    off the first of each. The counts by shape are kept in that order, and sorted again only
    when a shape's first holder changed (a few evaluations in a hundred)."""

    def __init__(self) -> None:
        self.index: dict[PartKey, int] = {}  # part key -> its shape's number
        self.numbers: dict[Shape, int] = {}
        self.shapes_seen: list[Shape] = []  # number -> shape
        self.counts: dict[int, int] = {}  # shape number -> parts of that shape listed
        self.holders: dict[int, dict[int, int]] = {}  # shape -> {place: first index}, by place
        self.top = -1  # the highest place entered since the last clear
        self.stamp = 0  # bumped by each clear: a reader whose counts were cleared rebuilds them
        self.counted: Counter[Shape] | None = None  # the counts by shape in order; None: to sort

    def ids(self, alloc: Allocation) -> tuple[int, ...]:
        """The shape numbers of ``alloc``'s parts, in its parts' order."""
        out = []
        for key in part_keys(alloc):
            number = self.index.get(key)
            if number is None:
                shape = next(iter(shapes_of(Counter({key: 1}))))
                number = self.numbers.get(shape)
                if number is None:
                    number = self.numbers[shape] = len(self.shapes_seen)
                    self.shapes_seen.append(shape)
                self.index[key] = number
            out.append(number)
        return tuple(out)

    def clear(self) -> None:
        self.counts.clear()
        self.holders.clear()
        self.top = -1
        self.stamp += 1
        self.counted = None

    def add(self, place: int, ids: tuple[int, ...]) -> None:
        counts, holders = self.counts, self.holders
        late = place < self.top  # a job moved in its place: it may come before a shape's holders
        self.top = max(self.top, place)
        for i, number in enumerate(ids):
            counts[number] = counts.get(number, 0) + 1
            held = holders.get(number)
            if held is None:
                holders[number] = {place: i}
                self.counted = None  # a shape first met
                continue
            if place not in held:
                held[place] = i
                if late:
                    holders[number] = dict(sorted(held.items()))
                    self.counted = None
            if self.counted is not None:
                self.counted[self.shapes_seen[number]] += 1

    def remove(self, place: int, ids: tuple[int, ...]) -> None:
        counts, holders = self.counts, self.holders
        for number in ids:
            left = counts[number] - 1
            if left:
                counts[number] = left
            else:
                del counts[number]
            held = holders.get(number)
            if held is not None and place in held:  # else a shape twice in one job: gone with the first
                if next(iter(held)) == place:
                    self.counted = None  # its first holder leaves (the last, when none is left)
                del held[place]
                if not held:
                    del holders[number]
            if self.counted is not None:
                self.counted[self.shapes_seen[number]] -= 1

    def shapes(self) -> Counter[Shape]:
        """The entered allocations' :func:`~exporter.analysis.workload.snapshot_shapes`."""
        counted = self.counted
        if counted is None:
            holders, counts, seen = self.holders, self.counts, self.shapes_seen
            order = sorted(counts, key=lambda number: next(iter(holders[number].items())))
            counted = self.counted = Counter({seen[number]: counts[number] for number in order})
        return Counter(counted)  # a copy: the analysis keeps it


class KeptAllocations:
    """The running jobs' allocations, in :attr:`Cluster.running`'s order, brought up to date
    at each snapshot from what changed since the last, not by a pass over every job.

    A job's allocation is kept, the same object (the planner's caches know it by identity),
    until the cluster says the job started, stopped or was relocated (its ``watchers``), or
    its next checkpoint is due (a heap by that time). ``running`` lists jobs in the order
    they entered it (:attr:`Cluster.entered`): a started one comes last, a moved one (stopped
    and started) leaves its place for the end, a relocated one keeps its place; so do these.
    The shapes of the allocations are counted in :attr:`parts` as they come and go."""

    def __init__(self, parts: PartCounts) -> None:
        self.parts = parts
        self.allocations: dict[int, Allocation] = {}  # job id -> allocation, in running's order
        # job id -> (its entry in running, its version, its last checkpoint, its parts' numbers)
        self.held: dict[int, tuple[int, int, float, tuple[int, ...]]] = {}
        self.due: list[tuple[float, int, int]] = []  # (next checkpoint, job id, version): a heap
        self.changed: set[int] = set()  # the cluster's watcher: jobs that changed since the last
        self.cluster: Cluster | None = None
        self.stamp = -1  # the parts' stamp when they were last built here
        self.now = -math.inf

    def update(self, sim: Sim, now: float) -> tuple[Allocation, ...]:
        """The allocations of every job running at ``now``, as :func:`snapshot_of` lists them."""
        cluster = sim.cluster
        interval = cluster.cost.checkpoint
        within = _within(interval)
        if cluster is not self.cluster or now < self.now or self.parts.stamp != self.stamp:
            self._rebuild(cluster, now, interval, within)
        else:
            self._follow(cluster, now, interval, within)
        self.now = now
        return tuple(self.allocations.values())

    def _rebuild(self, cluster: Cluster, now: float, interval: float, within: float) -> None:
        if cluster is not self.cluster:
            if self.cluster is not None:
                self.cluster.watchers[:] = [w for w in self.cluster.watchers if w is not self.changed]
            self.changed = set()
            cluster.watchers.append(self.changed)
            self.cluster = cluster
        self.changed.clear()
        self.allocations.clear()
        self.held.clear()
        self.due.clear()
        self.parts.clear()
        self.stamp = self.parts.stamp
        for job in cluster.running.values():
            self._enter(job, cluster.entered[job.id], now, interval, within)

    def _follow(self, cluster: Cluster, now: float, interval: float, within: float) -> None:
        running, entered, held = cluster.running, cluster.entered, self.held
        started = []
        for job_id in self.changed:
            job = running.get(job_id)
            was = held.get(job_id)
            if was is not None:
                if job is not None and entered[job_id] == was[0]:
                    if job.version != was[1]:  # relocated: rebuilt in its place
                        self.parts.remove(was[0], was[3])
                        self._enter(job, was[0], now, interval, within)
                    continue
                self._leave(job_id, was)
            if job is not None:
                started.append(job)
        self.changed.clear()
        # every job still kept entered running before these did: they come last, as they entered
        started.sort(key=lambda j: entered[j.id])
        for job in started:
            self._enter(job, entered[job.id], now, interval, within)
        due, allocations, again = self.due, self.allocations, []
        while due and due[0][0] <= now:  # snapshot_of's ``now < checkpoint + within`` no longer holds
            _, job_id, version = due[0]
            was = held.get(job_id)
            if was is None or was[1] != version:
                heapq.heappop(due)  # the job changed since: its entry now is another
                continue
            checkpoint = _checkpoint(running[job_id], now, interval)
            if checkpoint == was[2]:
                again.append(heapq.heappop(due))  # float rounding at the boundary: looked at next time
                continue
            # the same run, checkpointed since: only the time differs
            allocations[job_id] = _checkpointed(allocations[job_id], checkpoint)
            held[job_id] = (was[0], version, checkpoint, was[3])
            heapq.heapreplace(due, (checkpoint + within, job_id, version))
        for entry in again:
            heapq.heappush(due, entry)

    def _enter(self, job: Job, place: int, now: float, interval: float, within: float) -> None:
        checkpoint = _checkpoint(job, now, interval)
        alloc = _allocation(job, checkpoint)
        ids = self.parts.ids(alloc)
        self.parts.add(place, ids)
        self.allocations[job.id] = alloc
        self.held[job.id] = (place, job.version, checkpoint, ids)
        if within < math.inf:
            heapq.heappush(self.due, (checkpoint + within, job.id, job.version))

    def _leave(self, job_id: int, was: tuple[int, int, float, tuple[int, ...]]) -> None:
        del self.allocations[job_id], self.held[job_id]
        self.parts.remove(was[0], was[3])


def _within(interval: float) -> float:
    """How long after a job's checkpoint the next may be due: ``checkpoint + interval``, less a
    millisecond, so float rounding near the boundary never keeps a stale one (time only moves
    forward, and a restart bumps the version)."""
    return interval - 1e-3 if interval > 0 else math.inf


def _checkpoint(job: Job, now: float, interval: float) -> float:
    """``job.last_checkpoint(now, interval)``, with the same arithmetic."""
    ran = now - job.resumed
    saved = math.floor(ran / interval) * interval if interval > 0 and ran > 0 else 0.0
    return job.resumed + saved


def _allocation(job: Job, checkpoint: float) -> Allocation:
    return Allocation(
        job=str(job.id),
        placements=tuple(Part(p.node_name, p.gpus, p.gpu_share if p.gpus else 1.0, p.cpus)
                         for p in job.placements),
        namespace=f"team-{job.id % NAMESPACES}", pod=f"job-{job.id}",
        priority=1000 if job.high else 0, start_time=job.placed,
        last_checkpoint_time=checkpoint, allowed_models=job.models)


def _checkpointed(last: Allocation, checkpoint: float) -> Allocation:
    """``last`` checkpointed at ``checkpoint`` (built as :func:`_allocation` builds it: every
    field not named here is its default)."""
    return Allocation(
        job=last.job, placements=last.placements, namespace=last.namespace, pod=last.pod,
        priority=last.priority, start_time=last.start_time, last_checkpoint_time=checkpoint,
        allowed_models=last.allowed_models)


SOURCE = (SourceStatus("simulate", True, 0.0, None),)  # the queue is listed: none pending is none


def one_partition(state: FleetState) -> FleetState:
    """``state`` with every node in the one partition :data:`PARTITION` (its arrays shared)."""
    return dataclasses.replace(state, pool_names=(PARTITION,),
                               pool=np.zeros(len(state.names), dtype=state.pool.dtype))


@functools.lru_cache(maxsize=4)
def _partitioned(fleet: SimFleet) -> tuple[tuple[Node, ...], tuple[Gpu, ...]]:
    return (tuple(dataclasses.replace(n, pool=PARTITION) for n in fleet.nodes),
            tuple(dataclasses.replace(g, pool=PARTITION) for g in fleet.gpus))


@functools.lru_cache(maxsize=4)
def _model_pools(fleet: SimFleet) -> dict[str, str]:
    """Each GPU model's pool, where all its nodes are in one."""
    pools: dict[str, set[str]] = {}
    for node in fleet.nodes:
        pools.setdefault(node.model, set()).add(node.pool)
    return {model: next(iter(names)) for model, names in pools.items() if len(names) == 1}


def snapshot_of(sim: Sim, now: float,
                cache: KeptAllocations | dict[int, tuple[int, float, Allocation, tuple[int, ...] | None]]
                | None = None,
                one_partition: bool = True,
                requests: dict[int, JobRequest] | None = None,
                parts: PartCounts | None = None) -> FleetSnapshot:
    """The simulated fleet as a source would report it: allocations and the pending queue
    (each job's GPUs and CPUs in all, as Slurm states them).

    ``cache``: a :class:`KeptAllocations` (the loop's) follows the running jobs by what
    changed since its last snapshot, its shapes counted in its ``parts``; a dict keeps each
    job's allocation while the job neither moved nor checkpointed, but looks at every job;
    None builds every allocation (what the kept ones are checked against). ``requests``
    keeps the listed queued jobs' requests the same way. ``parts`` (not with a
    :class:`KeptAllocations`) is given the listed allocations' parts, to count the
    snapshot's shapes from. ``one_partition``: see :attr:`AdvisorStrategy.one_partition`.
    """
    fleet = sim.fleet
    if isinstance(cache, KeptAllocations):
        assert parts is None or parts is cache.parts
        allocations = cache.update(sim, now)
    else:
        allocations = _walk(sim, now, {} if cache is None else cache, parts)
    listed: dict[int, JobRequest] = {}
    # a pool per model: a job that may use one model waits in that model's partition, as the
    # scheduler's heads do and Slurm lists its partition; in one partition, every job in it.
    # The first PENDING_LISTED jobs are listed, and past them each pool's first: a source lists
    # every pending job, and a pool whose jobs queue behind another's would have no head here
    pool_of = {} if one_partition else _model_pools(fleet)
    unseen = set() if one_partition else {"", *pool_of.values()}
    queued = sim.scheduler.queue.ordered()
    for j in queued if unseen else itertools.islice(queued, PENDING_LISTED):
        pool = pool_of.get(j.models[0], "") if len(j.models) == 1 else ""
        if len(listed) >= PENDING_LISTED:
            if not unseen:
                break
            if pool not in unseen:
                continue
        unseen.discard(pool)
        # a queued job's request never changes (its fields are set once): built once
        request = requests.get(j.id) if requests is not None else None
        if request is None:
            request = JobRequest(str(j.id), j.gpus * j.parts, j.share if j.gpus else 1.0, j.cpus * j.parts,
                                 j.parts, j.models, priority=1000 if j.high else 0, submit_time=j.submit,
                                 pool=pool)
        listed[j.id] = request
    if requests is not None:
        requests.clear()
        requests.update(listed)
    pending = tuple(listed.values())
    nodes, gpus = _partitioned(fleet) if one_partition else (fleet.nodes, fleet.gpus)
    return FleetSnapshot(now, nodes, gpus, allocations, pending, SOURCE)


def _walk(sim: Sim, now: float, cache: dict[int, tuple[int, float, Allocation, tuple[int, ...] | None]],
          parts: PartCounts | None) -> tuple[Allocation, ...]:
    """Every running job's allocation, each looked at: kept in ``cache`` while the job's
    version and checkpoint are (its parts' numbers only with the version)."""
    interval = sim.cluster.cost.checkpoint
    running = sim.cluster.running
    allocations: list[Allocation] = []
    if parts is not None:
        parts.clear()
    within = _within(interval)
    for job in running.values():
        held = cache.get(job.id)
        if held is None or held[0] != job.version or not now < held[1] + within:
            checkpoint = _checkpoint(job, now, interval)
            if held is not None and held[0] == job.version:
                if held[1] != checkpoint:  # the same run, checkpointed since: only the time differs
                    held = (job.version, checkpoint, _checkpointed(held[2], checkpoint), held[3])
            else:
                held = (job.version, checkpoint, _allocation(job, checkpoint), None)
        if parts is not None and held[3] is None:
            held = (*held[:3], parts.ids(held[2]))
        cache[job.id] = held
        if parts is not None:
            assert held[3] is not None
            parts.add(len(allocations), held[3])
        allocations.append(held[2])
    if len(cache) > len(running):
        for gone in cache.keys() - running.keys():
            del cache[gone]
    return tuple(allocations)


__all__ = ["AdvisorStrategy", "KeptAllocations", "PartCounts", "snapshot_of"]
