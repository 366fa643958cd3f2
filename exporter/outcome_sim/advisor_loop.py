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
    from exporter.outcome_sim.sim import Sim

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
    # job -> (its version, its last checkpoint, its allocation, its parts' ids in _parts):
    # rebuilt only when the version or the checkpoint changed (the ids only with the version)
    _allocations: dict[int, tuple[int, float, Allocation, tuple[int, ...] | None]] = field(
        default_factory=dict, repr=False)
    _parts: PartCounts = field(default_factory=lambda: PartCounts(), repr=False)
    _requests: dict[int, JobRequest] = field(default_factory=dict, repr=False)  # queued job -> request

    def __post_init__(self) -> None:
        self.interval = min(TICK, self.evaluate_every)

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

        snapshot = snapshot_of(sim, now, self._allocations, self.one_partition, self._requests, self._parts)
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
    """The parts of a snapshot's allocations, to count its shapes without a pass over them.

    Each distinct part key (:func:`~exporter.analysis.workload.part_keys`) is numbered once;
    :func:`snapshot_of` keeps each job's numbers with its allocation and lists them here in
    the allocations' order. Counting small ints instead of hashing each job's key tuple
    again, then naming them back in the order first counted, gives ``snapshot_shapes``' own
    counts in its own order (``typical`` breaks ties by it)."""

    def __init__(self) -> None:
        self.index: dict[PartKey, int] = {}
        self.keys: list[PartKey] = []
        self.listed: list[tuple[int, ...]] = []  # the last snapshot's, one per allocation

    def ids(self, alloc: Allocation) -> tuple[int, ...]:
        out = []
        for key in part_keys(alloc):
            number = self.index.get(key)
            if number is None:
                number = self.index[key] = len(self.keys)
                self.keys.append(key)
            out.append(number)
        return tuple(out)

    def shapes(self) -> Counter[Shape]:
        """The listed allocations' :func:`~exporter.analysis.workload.snapshot_shapes`."""
        keys = self.keys
        counted = Counter(itertools.chain.from_iterable(self.listed))
        return shapes_of(Counter({keys[number]: n for number, n in counted.items()}))


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
                cache: dict[int, tuple[int, float, Allocation, tuple[int, ...] | None]] | None = None,
                one_partition: bool = True,
                requests: dict[int, JobRequest] | None = None,
                parts: PartCounts | None = None) -> FleetSnapshot:
    """The simulated fleet as a source would report it: allocations and the pending queue
    (each job's GPUs and CPUs in all, as Slurm states them).

    ``cache`` keeps each job's allocation while the job neither moved nor checkpointed, so a
    snapshot of a thousand jobs costs a few allocations, not a thousand; ``requests`` keeps
    the listed queued jobs' requests the same way. ``parts`` is given each listed
    allocation's parts, in order (their ids kept in ``cache`` with the allocation), to count
    the snapshot's shapes from. ``one_partition``: see :attr:`AdvisorStrategy.one_partition`.
    """
    fleet = sim.fleet
    interval = sim.cluster.cost.checkpoint
    cache = {} if cache is None else cache
    running = sim.cluster.running
    allocations = []
    if parts is not None:
        parts.listed.clear()
    # a job's checkpoint is the same until the next is due: ``checkpoint + interval``, less a
    # millisecond, so float rounding near the boundary never keeps a stale one (time only
    # moves forward, and a restart bumps the version)
    within = interval - 1e-3 if interval > 0 else math.inf
    for job in running.values():
        held = cache.get(job.id)
        if held is not None and held[0] == job.version and now < held[1] + within:
            allocations.append(held[2])
            if parts is not None:
                parts.listed.append(held[3] if held[3] is not None else parts.ids(held[2]))
            continue
        # job.last_checkpoint(now, interval), inlined with the same arithmetic: this loop runs
        # over every running job at every evaluation (5,000 of them on openb)
        ran = now - job.resumed
        saved = math.floor(ran / interval) * interval if interval > 0 and ran > 0 else 0.0
        checkpoint = job.resumed + saved
        if held is not None and held[0] == job.version and held[1] != checkpoint:
            # the same run, checkpointed since: only the time differs (a restart bumps the version)
            last = held[2]  # built below: every field not named here is its default
            held = (job.version, checkpoint, Allocation(
                job=last.job, placements=last.placements, namespace=last.namespace, pod=last.pod,
                priority=last.priority, start_time=last.start_time, last_checkpoint_time=checkpoint,
                allowed_models=last.allowed_models), held[3])
            cache[job.id] = held
        elif held is None or held[0] != job.version:
            alloc = Allocation(
                job=str(job.id),
                placements=tuple(Part(p.node_name, p.gpus, p.gpu_share if p.gpus else 1.0, p.cpus)
                                 for p in job.placements),
                namespace=f"team-{job.id % NAMESPACES}", pod=f"job-{job.id}",
                priority=1000 if job.high else 0, start_time=job.placed,
                last_checkpoint_time=checkpoint, allowed_models=job.models)
            held = (job.version, checkpoint, alloc, None if parts is None else parts.ids(alloc))
            cache[job.id] = held
        allocations.append(held[2])
        if parts is not None:
            parts.listed.append(held[3] if held[3] is not None else parts.ids(held[2]))
    if len(cache) > len(running):
        for gone in cache.keys() - running.keys():
            del cache[gone]
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
    return FleetSnapshot(now, nodes, gpus, tuple(allocations), pending, SOURCE)


__all__ = ["AdvisorStrategy", "PartCounts", "snapshot_of"]
