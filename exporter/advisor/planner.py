"""Which jobs move where: compaction plans whose every move has a verified destination.

Starting from the most fragmented nodes of the scope, the planner tries to
evacuate each one, moving its jobs cheapest first and re-placing every job with
the placement engine's ``fgd`` policy on another node. Moving one job rarely
lowers F(M) by itself (a node with 5 free GPUs is as useless to an 8-GPU job as
one with 6), so an evacuation is judged as a whole: of the jobs moved off a
node, the prefix that lowers the cluster's F(M) the most per migration is
kept, and the rest go back. A move is only ever kept with its destination found and
applied on the same working copy of the fleet, so no two moves can count on
the same free GPU. This is the bar NVIDIA's KAI scheduler holds consolidation
to: nothing is evicted without a place to go.

Constraints are never broken: a job only goes to a GPU model its memory need
allows (the reference cluster's tiers) and that its own allowed-model list
permits; a job that states no memory need goes only to a model with at least
the memory per GPU of its current one (:func:`destination_models`); a job
stays in its pool (a Slurm partition or node pool is where it was admitted)
and never goes to, or comes from, a MIG-mode GPU (a whole or shared GPU is not
a MIG slice); multi-node jobs are never moved, so never split and never spread
over NVLink generations; high-priority jobs stay put unless configured; budgets
cap migrations per plan, per node and per namespace.

Every move can start before the plan expires: a job too young to move before
``expires_at`` is deferred to a later plan rather than listed as a wait the
receiver would have to carry past the plan's expiry (a longer expiry would keep
a plan alive on an ever older snapshot instead).

A move's cost is the work lost since the job's last checkpoint: the one the job
stated, or, when it states none and the site says its jobs checkpoint every
``checkpoint_interval`` (the reference cluster's 15 min), the last multiple of
that interval since it started; otherwise its whole runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.right_sizing import misplacements
from exporter.advisor.surge import SMALL_GPUS as SMALL_GPUS  # the planner's docs name it
from exporter.advisor.surge import SmallDemand, free_gpus, shortfall
from exporter.advisor.surge import small as _small
from exporter.analysis.fgd import CompiledWorkload
from exporter.analysis.index import Report, scorer, totals
from exporter.analysis.state import FleetState
from exporter.gpu_catalogue import default_catalogue
from exporter.placement.engine import Placement, Placer, room_after_moves
from exporter.placement.policies import FgdTies
from exporter.placement.task import Task
from exporter.placement.tiers import tier_models
from exporter.snapshot import Allocation, FleetSnapshot, JobRequest

IMPROVEMENT = 1e-6  # GPUs of F(M) a kept evacuation must save, above float noise
WHOLE_NODE_GPUS = 8  # "whole nodes freed" counts nodes an 8-GPU job could now start on
PENDING_CHECKED = 200  # pending jobs a plan is checked against (in the source's order), each shape once
PENDING_NODES_TRIED = 16  # nodes tried per part of a pending job, the fewest GPUs to free first
EXACT_FGD = FgdTies(0.0, 0.0, "first")


@dataclass(frozen=True, slots=True)
class PlanSettings:
    max_migrations: int = 10
    max_per_node: int = 4
    max_per_namespace: int = 5
    move_high_priority: bool = False
    high_priority: int = 1000
    min_runtime_seconds: float = 1800.0
    ttl_seconds: float = 900.0
    # jobs that state no checkpoint are taken to checkpoint this often; 0: they never do
    checkpoint_interval_seconds: float = 900.0
    # which pending jobs a plan is made for (RULES): "head", the queue's head alone; "queue",
    # the head and then the next blocked jobs the moves left in the budget can start, each kept
    # only where the waiting it ends pays for the work its moves cost (:func:`plan_for_queue`)
    rule: str = "queue"
    # seconds a moved job takes to restore its checkpoint, its destination GPUs held meanwhile:
    # part of a move's cost besides the work lost (gpufleet simulate's --restore default)
    restore_seconds: float = 120.0
    # a blocked job beyond the head is planned for only where the GPU-hours of waiting it ends
    # are at least this many times the GPU-hours of work its moves cost
    min_saved_per_work: float = 1.0
    # under "starts": seconds until the next plan, over which the room a plan takes would
    # otherwise see small jobs start (the advisor's evaluation interval)
    starts_horizon_seconds: float = 600.0
    # under "horizon": the longest the room a plan takes is counted as held (the head's expected
    # run time, :func:`expected_runtime`, beyond this is not believed: the small jobs' rate is
    # read from the last hour, and the arrivals' daily rhythm makes it a poor guide for longer)
    horizon_cap_seconds: float = 6 * 3600.0


# "horizon-room" is "horizon" with the room the head's reservation holds anyway not counted
# (:func:`reservation_held`); "horizon-surge" is "horizon-room" that also refuses a plan starting
# a whole-node job into room the small jobs' forecast daily rise needs (exporter.advisor.surge);
# "horizon-lull" refuses it so only while no small job is queued (the room is theirs to lose
# only then: once they queue, the head's reservation holds it from them anyway)
RULES = ("head", "queue", "starts", "horizon", "horizon-room", "horizon-surge", "horizon-lull")
QUEUE_RULES = ("queue", "starts", "horizon", *RULES[4:])  # they plan past the head
ROOM_RULES = ("horizon-room", "horizon-surge", "horizon-lull")  # the reservation's room not counted
SURGE_RULES = ("horizon-surge", "horizon-lull")  # the small jobs' forecast rise counted
STARTS_LOOKBACK = 3600.0  # seconds of past starts the small jobs' rate is read from
QUEUE_JOBS = 8  # blocked jobs one plan is made for under the queue rule, the head included


@dataclass(frozen=True, slots=True)
class Candidate:
    """One running single-node job the planner may move."""

    alloc: Allocation
    node: int
    current: Placement  # where it is now, in placer terms
    task: Task  # what re-placing it must find, on the models it may move to
    cost: float  # GPU-seconds of work since its last checkpoint
    age: float
    checkpointed: bool  # it checkpoints (stated, or assumed from the interval)


def _slots(state: FleetState, node: int, gpus: Sequence[int],
           rows: dict[int, dict[int, int]] | None = None) -> tuple[int, ...] | None:
    """The ``gpu_free`` slots of a job's GPUs on ``node``; None if one is down (not listed).
    ``rows`` keeps each node's GPU -> slot map over one call of :func:`candidates`."""
    slot_of = None if rows is None else rows.get(node)
    if slot_of is None:
        row = state.gpu_index[node] if state.gpu_index is not None else np.arange(state.gpu_free.shape[1])
        slot_of = {}
        for index, gpu in enumerate(row.tolist()):
            slot_of.setdefault(int(gpu), index)
        if rows is not None:
            rows[node] = slot_of
    found = []
    for gpu in gpus:
        where = slot_of.get(int(gpu))
        if where is None:  # the job sits on a GPU that is down: not ours to move
            return None
        found.append(where)
    return tuple(found)


def destination_models(alloc: Allocation, current_model: str, fleet_models: Sequence[str]) -> tuple[str, ...]:
    """The models a job may move to: its tier's (by memory need) within its own allowed list.

    Without a stated memory need, the models with at least as much memory per GPU as the
    one it runs on (within its allowed list): whatever it holds now fits there. The
    planner keeps every job in its pool besides, so this only widens anything in a pool
    of several models (a Slurm partition of mixed GPUs), where a job not pinned to a
    model is one the scheduler itself could have started on any of them. A model whose
    memory the catalogue does not know is taken as no larger than any: the job stays.
    """
    return destinations_by_value(alloc.gpu_memory_need_bytes, tuple(alloc.allowed_models), current_model,
                                 tuple(fleet_models))


@functools.lru_cache(maxsize=4096)
def destinations_by_value(need: int | None, allowed_models: tuple[str, ...], current_model: str,
                          fleet_models: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`destination_models` by value, kept: a fleet's thousand jobs have a few dozen keys."""
    if need:
        return tier_models(need, fleet_models, allowed_models)
    allowed = set(allowed_models) if allowed_models else None
    held = _memory_per_gpu(current_model)
    models = [current_model] if allowed is None or current_model in allowed else []
    if held:
        models += [m for m in fleet_models if m != current_model and (allowed is None or m in allowed)
                   and _memory_per_gpu(m) >= held]
    return tuple(models)


@functools.lru_cache(maxsize=256)
def _memory_per_gpu(model: str) -> int:
    """The catalogue's memory per GPU of ``model`` in bytes; 0 when unknown."""
    return default_catalogue().get(model).memory_bytes or 0


def last_checkpoint(alloc: Allocation, now: float, interval: float) -> float | None:
    """When the job last saved its work: stated, or the last whole interval since it started.

    None when it states nothing and the site assumes no checkpointing (interval 0).
    """
    if alloc.last_checkpoint_time is not None:
        return min(alloc.last_checkpoint_time, now)
    if interval <= 0:
        return None
    started = alloc.start_time if alloc.start_time is not None else now
    age = max(0.0, now - started)
    return started + (age // interval) * interval


def mig_nodes(snapshot: FleetSnapshot) -> set[str]:
    """Nodes with a GPU in MIG mode: their GPUs are slices, no place for a whole or shared GPU."""
    return {g.node for g in snapshot.gpus if g.mig}


def candidates(snapshot: FleetSnapshot, state: FleetState, now: float,
               settings: PlanSettings, deferred: list[Allocation] | None = None,
               kept_state: KeptState | None = None) -> dict[int, list[Candidate]]:
    """Movable jobs per node index, cheapest first.

    A job that could only move after the plan expires goes to ``deferred`` instead.
    ``kept_state``: the planner's kept state (:class:`KeptState`); without one, a fresh one.
    """
    later_all: list[Allocation] = []
    by_node = _candidates(snapshot, state, now, settings, later_all, {}, kept_state)
    if deferred is not None:
        deferred.extend(later_all)
    return by_node


def cpu_only_candidates(snapshot: FleetSnapshot, state: FleetState, now: float,
                        settings: PlanSettings, kept_state: KeptState | None = None
                        ) -> dict[int, list[Candidate]]:
    """Movable CPU-only jobs per node index, as :func:`candidates`.

    They fragment no GPU, so compaction leaves them; but one on a GPU node holds CPUs a
    GPU job needs there, and a plan for a pending job may have to move it (in the
    simulated fleet, consolidation's plans for gangs did, and no plan without it existed).
    """
    cpu_by_node: dict[int, list[Candidate]] = {}
    _candidates(snapshot, state, now, settings, [], cpu_by_node, kept_state)
    return cpu_by_node


@dataclass(frozen=True, slots=True)
class _Where:
    """What of a candidate depends on the job and the fleet's layout only, not on the time."""

    node: int
    current: Placement
    task: Task
    gpus: float  # GPUs it holds, times its share: the cost's rate
    holds_gpus: bool
    demand: float  # task.gpu_demand, kept: the pending planner sums it over every job

    def candidate(self, alloc: Allocation, now: float, settings: PlanSettings) -> Candidate:
        """The job as a :class:`Candidate` at ``now``: its cost is the work since its last
        checkpoint, times the GPUs it holds."""
        started = alloc.start_time if alloc.start_time is not None else now
        checkpoint = last_checkpoint(alloc, now, settings.checkpoint_interval_seconds)
        since = started if checkpoint is None else max(started, checkpoint)
        return Candidate(alloc, self.node, self.current, self.task, self.gpus * max(0.0, now - since),
                         max(0.0, now - started), checkpoint is not None)


class _Layout:
    """Each job's :class:`_Where` (or None: never movable) over calls on one fleet layout.

    The simulated fleet asks for candidates every evaluation while most of its jobs stay
    put; this keeps, per job, the part of :func:`_candidates`' work that only the job and
    the layout decide, and drops the jobs gone. It is kept while the job's allocation is
    the same object, or one with the same placements, priority, allowed models and memory
    need (what :func:`_where` reads): a source that reports a new checkpoint time builds a
    new allocation for a job that has not moved. A new layout (another node list, GPU
    slots, CPUs, models, MIG nodes or priority rule) starts it over.
    """

    def __init__(self) -> None:
        self.key: tuple[object, ...] = ()
        self.arrays: tuple[np.ndarray, ...] = ()
        self.kept: dict[str, tuple[Allocation, _Where | None]] = {}

    def start(self, state: FleetState, mig: set[str], settings: PlanSettings) -> None:
        key = (state.names, state.model_names, frozenset(mig), settings.high_priority,
               settings.move_high_priority)
        arrays = (state.cpu_total, state.model,
                  state.gpu_index if state.gpu_index is not None else np.empty(0))
        if key != self.key or not all(a.shape == b.shape and np.array_equal(a, b)
                                      for a, b in zip(arrays, self.arrays, strict=True)):
            self.key, self.arrays, self.kept = key, tuple(a.copy() for a in arrays), {}


class KeptState:
    """What a planner keeps from one call to the next: each job's :class:`_Where` on the
    fleet's layout (:class:`_Layout`), and the pending planner's working copy of the fleet,
    kept on one layout, workload and tie rule and synced to each call's state
    (:meth:`Placer.sync`). The simulated advisor plans every minute on a fleet that changed
    on a few nodes, and a new placer scored every node again for each job shape it placed.

    A planner holds one (:class:`exporter.advisor.advise.Planner`), and one call at a time
    plans with it: a call that finds it in use (a what-if past its time limit runs on beside
    the next evaluation) plans on a fresh one of its own, and neither disturbs the other.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.layout = _Layout()
        self.placer: Placer | None = None

    @contextlib.contextmanager
    def borrow(self) -> Iterator[KeptState]:
        """This kept state, or, while another call plans with it, a fresh one."""
        if not self.lock.acquire(blocking=False):
            yield KeptState()
            return
        try:
            yield self
        finally:
            self.lock.release()

    def placer_for(self, state: FleetState, cw: CompiledWorkload) -> Placer:
        """The kept placer synced to ``state``; a new one for another layout or workload."""
        placer = self.placer
        if placer is not None and placer.workload is cw:
            try:
                placer.sync(state)
                return placer
            except ValueError:
                pass  # another layout: start over
        self.placer = placer = Placer(state, cw, fgd_ties=EXACT_FGD)
        return placer


def _where(alloc: Allocation, state: FleetState, index: dict[str, int], mig: set[str],
           settings: PlanSettings, rows: dict[int, dict[int, int]]) -> _Where | None:
    """The job's node, placement and re-placement task; None when the planner never moves it."""
    if len(alloc.placements) != 1:
        return None  # multi-node: never split, and not moved whole by this planner
    if alloc.priority >= settings.high_priority and not settings.move_high_priority:
        return None
    part = alloc.placements[0]
    node = index.get(part.node)
    if node is None or part.node in mig:
        return None  # not in the fleet, or it holds MIG slices, which the placer does not model
    slots = _slots(state, node, part.gpus, rows)
    if slots is None:
        return None
    share = part.gpu_share if part.gpus else 1.0  # a CPU-only job's share says nothing
    if not 0 < share <= 1 or part.cpus > state.cpu_total[node]:
        # it holds more than its node has: the placer, which clamps at the node's
        # capacity, could not put it back after trying a move ("no longer fits")
        return None
    current_model = state.model_names[int(state.model[node])]
    models = destinations_by_value(alloc.gpu_memory_need_bytes, tuple(alloc.allowed_models), current_model,
                                   state.model_names)
    if not models:
        return None
    current = Placement(node, part.node, slots, tuple(part.gpus), share if part.gpus else 0.0, part.cpus)
    # Task.from_allocation's task with the models narrowed (built once, not replaced)
    task = Task(part.cpus, len(part.gpus), share, models if part.gpus else (), alloc.gpu_memory_need_bytes)
    return _Where(node, current, task, len(part.gpus) * part.gpu_share, bool(part.gpus), task.gpu_demand)


def _same_layout(kept: Allocation, alloc: Allocation) -> bool:
    """Whether :func:`_where` would answer the same for ``alloc`` as for ``kept`` (by value;
    the caller has tried ``is`` first, the common case)."""
    return (kept.placements == alloc.placements and kept.priority == alloc.priority
            and kept.allowed_models == alloc.allowed_models
            and kept.gpu_memory_need_bytes == alloc.gpu_memory_need_bytes)


def _movable_jobs(snapshot: FleetSnapshot, state: FleetState, settings: PlanSettings, layout: _Layout,
                  mig: set[str] | None = None) -> list[tuple[Allocation, _Where]]:
    """Every job the planner may move, with its :class:`_Where`, in the snapshot's order;
    ``layout`` keeps each job's answer for the next call. ``mig``: the snapshot's
    :func:`mig_nodes`, when the caller has them."""
    rows: dict[int, dict[int, int]] = {}
    index: dict[str, int] | None = None
    if mig is None:
        mig = mig_nodes(snapshot)
    layout.start(state, mig, settings)
    kept = layout.kept
    now_kept: dict[str, tuple[Allocation, _Where | None]] = {}
    out: list[tuple[Allocation, _Where]] = []
    for alloc in snapshot.allocations:
        job = alloc.job
        found = kept.get(job)
        if found is not None and found[0] is alloc:  # most jobs: the pair kept is this one's
            now_kept[job] = found
            if found[1] is not None:
                out.append(found)  # type: ignore[arg-type]  # its where is not None: a pair of out's
            continue
        if found is not None and _same_layout(found[0], alloc):
            where = found[1]
        else:
            if index is None:
                index = {name: i for i, name in enumerate(state.names)}
            where = _where(alloc, state, index, mig, settings, rows)
        if where is None:
            now_kept[job] = (alloc, None)
        else:
            pair = (alloc, where)
            now_kept[job] = pair
            out.append(pair)
    layout.kept = now_kept
    return out


def _candidates(snapshot: FleetSnapshot, state: FleetState, now: float, settings: PlanSettings,
                deferred: list[Allocation], cpu_by_node: dict[int, list[Candidate]],
                kept_state: KeptState | None) -> dict[int, list[Candidate]]:
    """The jobs holding GPUs, per node; CPU-only ones go to ``cpu_by_node``."""
    by_node: dict[int, list[Candidate]] = {}
    expires = now + settings.ttl_seconds
    with (KeptState() if kept_state is None else kept_state).borrow() as working:
        movable = _movable_jobs(snapshot, state, settings, working.layout)
    for alloc, where in movable:
        started = alloc.start_time if alloc.start_time is not None else now
        if max(0.0, now - started) < settings.min_runtime_seconds \
                and started + settings.min_runtime_seconds > expires:
            deferred.append(alloc)
            continue
        (by_node if where.holds_gpus else cpu_by_node).setdefault(where.node, []).append(
            where.candidate(alloc, now, settings))
    for jobs in (*by_node.values(), *cpu_by_node.values()):
        jobs.sort(key=lambda c: (c.cost, c.alloc.job))
    return by_node


def _action(c: Candidate, now: float, settings: PlanSettings) -> tuple[str, float | None]:
    if c.age < settings.min_runtime_seconds:
        started = c.alloc.start_time if c.alloc.start_time is not None else now
        return "wait_until", started + settings.min_runtime_seconds
    if not c.checkpointed:
        return "migrate", None  # it never checkpoints: restarting is all there is
    return "checkpoint_then_migrate", None


def source_order(node_fragmented: np.ndarray, movable: dict[int, list[Candidate]],
                 in_scope: np.ndarray) -> list[int]:
    """Nodes to try evacuating: in scope, fragmented, with a movable job; most fragmented first."""
    nodes = [n for n in movable if in_scope[n] and node_fragmented[n] > IMPROVEMENT]
    return sorted(nodes, key=lambda n: (-node_fragmented[n], n))


def best_prefix(start: float, after: list[float]) -> int:
    """How many of an evacuation's moves to keep: the prefix recovering the most per migration.

    ``after[k-1]`` is F(M) once the first k moves are made. A budget of migrations
    is what a plan spends, so gain per migration, not gain alone, is what to
    maximise: on the openb trace this recovers 2.1-3.8x the descheduler
    baseline's GPUs per migration, against 1.7-3.2x when keeping the largest gain
    (bench/advisor.py).
    """
    best, keep = 0.0, 0
    for k, f in enumerate(after, start=1):
        gain = start - f
        if gain > IMPROVEMENT and gain / k > best + 1e-12:
            best, keep = gain / k, k
    return keep


def _whole_free(placer: Placer, nodes: np.ndarray) -> np.ndarray:
    gpus = placer.gpu_count[nodes]
    free = (placer.gpu_free[nodes] >= 1.0 - 1e-9).sum(axis=1)
    return (gpus >= WHOLE_NODE_GPUS) & (free >= gpus)


def plan_compaction(snapshot: FleetSnapshot, report: Report, scope: str, now: float,
                    settings: PlanSettings = PlanSettings(), kept_state: KeptState | None = None
                    ) -> CompactionPlan:
    """The compaction plan for ``scope`` ("cluster" or "pool:<name>"); ``kept_state``: the
    planner's kept state (:class:`KeptState`), without one a fresh one."""
    state, cw = report.state, report.workload
    # fgd as defined (the least growth of F, exact ties to the first node), not the near-tie
    # band a scheduler uses to keep nodes whole for shapes F cannot see: each move here must
    # lower F(M) by what it claims (bench/advisor.py: the band cut recovery per move to 2.0x)
    placer = Placer(state, cw, fgd_ties=EXACT_FGD)
    in_scope = np.ones(len(state.names), dtype=bool)
    if scope.startswith("pool:"):
        pool = scope.removeprefix("pool:")
        in_scope = np.array([state.pool_names[p] == pool for p in state.pool])
    assert placer.node_fragmented is not None
    deferred: list[Allocation] = []
    movable = candidates(snapshot, state, now, settings, deferred, kept_state)
    # where each pool's jobs may not go: other pools, and MIG-mode nodes
    mig = mig_nodes(snapshot)
    is_mig = np.array([name in mig for name in state.names], dtype=bool)
    barred = {int(p): np.flatnonzero((state.pool != p) | is_mig).tolist()
              for p in np.unique(state.pool)}
    order = source_order(placer.node_fragmented, movable, in_scope)
    whole_before = _whole_free(placer, np.arange(len(state.names)))
    blocked = blocked_pending(placer, state, snapshot.pending, is_mig)

    kept: list[tuple[Candidate, Placement]] = []
    per_node: Counter[int] = Counter()
    per_namespace: Counter[str] = Counter()
    moved: set[str] = set()
    arrived: set[int] = set()  # nodes that received a job: not evacuated afterwards
    rejected = 0
    for node in order:
        if len(kept) >= settings.max_migrations:
            break
        if node in arrived:
            continue
        start_f = placer.fragmented_gpus
        trial: list[tuple[Candidate, Placement, float]] = []
        for c in movable[node]:
            if (len(kept) + len(trial) >= settings.max_migrations
                    or per_node[node] + len(trial) >= settings.max_per_node
                    or per_namespace[c.alloc.namespace]
                    + sum(1 for t in trial if t[0].alloc.namespace == c.alloc.namespace)
                    >= settings.max_per_namespace
                    or c.alloc.job in moved):
                continue
            placer.release(c.current)
            destination = placer.place(c.task, "fgd", exclude=[*barred[int(state.pool[node])], node])
            if destination is None:
                placer.apply(c.current)  # no verified destination: the job stays
                rejected += 1
                continue
            placer.apply(destination)
            trial.append((c, destination, placer.fragmented_gpus))
        keep = best_prefix(start_f, [f for _, _, f in trial])
        for c, destination, _ in reversed(trial[keep:]):  # undo what didn't pay, last first
            placer.release(destination)
            placer.apply(c.current)
            rejected += 1
        for c, destination, _ in trial[:keep]:
            kept.append((c, destination))
            per_node[node] += 1
            per_namespace[c.alloc.namespace] += 1
            moved.add(c.alloc.job)
            arrived.add(destination.node)

    before = _prediction(report, scope, state, cw)
    after = _prediction(report, scope, placer.state, cw)
    whole_after = _whole_free(placer, np.arange(len(state.names)))
    freed: Counter[str] = Counter()
    for n in np.flatnonzero(whole_after & ~whole_before & in_scope):
        freed[state.pool_names[int(state.pool[n])]] += 1
    migrations = tuple(_migration(c, d, now, settings) for c, d in kept)
    started = starts(placer, blocked) if kept else ()
    sources = sorted({c.current.node_name for c, _ in kept})
    reasons = [f"evacuates {', '.join(sources) or 'no node'}; {rejected} candidate moves dropped "
               "(no destination, or F(M) would not drop)"]
    if deferred:
        reasons.append(f"{len(deferred)} job{'s' if len(deferred) != 1 else ''} younger than "
                       f"{settings.min_runtime_seconds / 60:.0f} min could not move before the plan "
                       f"expires ({settings.ttl_seconds / 60:.0f} min): left to a later plan")
    return CompactionPlan(
        scope=scope, snapshot_time=snapshot.taken_at, expires_at=now + settings.ttl_seconds,
        decision="compact", reasons=tuple(reasons), before=before, after=after,
        nodes_freed=dict(sorted(freed.items())), migrations=migrations,
        tier_misplacements=misplacements(snapshot, report), rejected_moves=rejected,
        lets_start=tuple(j.job for j in started),
        gpu_hours_waiting_saved=waiting_saved(started, now),
    )


# -- planning for a pending job ---------------------------------------------------------
#
# What pays is a move that lets a waiting job start (docs/simulate.md, "The decision rule,
# revised"): a compaction plan is judged by the pending jobs it lets start, and a pending job
# blocked by fragments, not capacity, gets a plan of its own.


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pending job as the placer sees it: ``parts`` tasks alike, on ``excluded`` nodes never."""

    job: JobRequest
    task: Task
    parts: int
    excluded: list[int]  # node indices barred to it: other pools, other models, MIG mode


def pending_task(job: JobRequest) -> tuple[Task, int] | None:
    """(one node's part, how many parts) of a pending job; None for one asking no GPU.

    Sources state a job's GPUs and CPUs in all (Slurm's ``gpu_count`` is per node times
    nodes); a part asks its share of each, whole GPUs rounded up.
    """
    parts = max(1, int(job.node_count))
    if job.gpu_count <= 0 or not 0 < job.gpu_share <= 1:
        return None
    gpus = math.ceil(job.gpu_count / parts)
    return Task(max(0.0, job.cpus) / parts, gpus, job.gpu_share, tuple(job.models)), parts


def _pending(state: FleetState, job: JobRequest, is_mig: np.ndarray,
             barred: dict[tuple, list[int]] | None = None) -> _Pending | None:
    """``job`` as the placer sees it. ``barred``: the excluded nodes by (GPUs a part, models,
    pool), which alone decide them on one ``state`` and ``is_mig``, to share between the jobs
    of one call (a queue of 200 has a few dozen such keys; the lists are never changed)."""
    made = pending_task(job)
    if made is None:
        return None
    task, parts = made
    key = (task.gpus, task.models, job.pool)
    excluded = None if barred is None else barred.get(key)
    if excluded is None:
        allowed = ~is_mig & (state.gpu_count >= task.gpus)
        if task.models:
            allowed &= np.isin(np.array(state.model_names, dtype=object)[state.model], task.models)
        if job.pool and job.pool in state.pool_names:
            allowed &= state.pool == state.pool_names.index(job.pool)
        excluded = np.flatnonzero(~allowed).tolist()
        if barred is not None:
            barred[key] = excluded
    return _Pending(job, task, parts, excluded)


def _undo(placer: Placer, log: list[tuple[bool, Placement]]) -> None:
    """Take back, last first, what was applied (True) and released (False)."""
    for applied, p in reversed(log):
        if applied:
            placer.release(p)
        else:
            placer.apply(p)
    log.clear()


def _place_parts(placer: Placer, p: _Pending, log: list[tuple[bool, Placement]]) -> bool:
    """Place every part of ``p`` (applied, logged), a gang's parts on one model, one per node;
    False, with what it placed taken back, when one part finds no room."""
    mark = len(log)
    excluded = list(p.excluded)
    for _ in range(p.parts):
        part = placer.place(p.task, "bestfit", exclude=excluded)
        if part is None:
            _undo_to(placer, log, mark)
            return False
        placer.apply(part)
        log.append((True, part))
        if p.parts > 1:
            if len(excluded) == len(p.excluded):  # the first part: the others go to its model
                excluded.extend(np.flatnonzero(placer.model != placer.model[part.node]).tolist())
            excluded.append(part.node)
    return True


def _undo_to(placer: Placer, log: list[tuple[bool, Placement]], mark: int) -> None:
    tail = log[mark:]
    del log[mark:]
    _undo(placer, tail)


def blocked_pending(placer: Placer, state: FleetState, pending: Iterable[JobRequest],
                    is_mig: np.ndarray) -> list[_Pending]:
    """The first :data:`PENDING_CHECKED` pending jobs (each shape once) that fit nowhere now."""
    out: list[_Pending] = []
    seen: set[tuple] = set()
    barred: dict[tuple, list[int]] = {}
    log: list[tuple[bool, Placement]] = []
    for count, job in enumerate(pending):
        if count >= PENDING_CHECKED:
            break
        key = (job.gpu_count, job.gpu_share, job.cpus, job.node_count, tuple(job.models), job.pool)
        if key in seen:
            continue
        seen.add(key)
        p = _pending(state, job, is_mig, barred)
        if p is None:
            continue
        if _place_parts(placer, p, log):
            _undo(placer, log)
        else:
            out.append(p)
    return out


def starts(placer: Placer, blocked: Sequence[_Pending]) -> tuple[JobRequest, ...]:
    """Which of ``blocked`` could start on the placer as it is now, together: each placed in
    turn, in the pending order, so no two count on the same GPUs; all taken back after."""
    log: list[tuple[bool, Placement]] = []
    started = []
    try:
        for p in blocked:
            if _place_parts(placer, p, log):
                started.append(p.job)
    finally:
        _undo(placer, log)
    return tuple(started)


def waiting_saved(started: Sequence[JobRequest], now: float) -> float:
    """GPU-hours of waiting a plan is expected to save: each job it lets start, its GPUs times
    the wait to come, estimated as the wait so far (no forecast of when room would free up
    without the plan; a job that has waited t is taken to wait about t more). 0 without a
    submit time."""
    hours = 0.0
    for job in started:
        if job.submit_time is not None:
            hours += job.gpu_count * job.gpu_share * max(0.0, now - job.submit_time) / 3600
    return round(hours, 3)


def plan_for_pending(snapshot: FleetSnapshot, report: Report, job: JobRequest, now: float,
                     settings: PlanSettings = PlanSettings(), kept_state: KeptState | None = None,
                     demand: SmallDemand | None = None) -> CompactionPlan | None:
    """The fewest moves, each to a verified destination, after which pending ``job`` starts;
    None when it fits already, or no such moves exist within ``max_migrations``.

    Per part of the job (one for a single-node job; a gang's parts on one model): of the
    nodes it may use, those whose free GPUs plus their movable jobs' could hold it, the
    fewest GPUs to free first (:data:`PENDING_NODES_TRIED` of them); on each, its movable
    jobs leave largest first until the part fits, each to a destination off that node
    placed by ``fgd`` on the working copy (later moves see earlier ones). The node needing
    the fewest moves wins. The movable jobs are :func:`candidates`', under its constraints
    (tier or own model, pool, MIG, priority), and only those past ``min_runtime`` (a plan
    for a waiting job does not wait); the namespace budget holds, the per-node one does
    not (emptying a node is this plan's purpose). ``kept_state``: the planner's kept state
    (:class:`KeptState`); without one, a fresh one.

    That is the ``head`` rule (``settings.rule``); under ``queue`` (:func:`plan_for_queue`'s
    account) the plan goes on past the head, and says what it costs (``demand``: the small
    jobs' hourly demand, for ``horizon-surge``).
    """
    with (KeptState() if kept_state is None else kept_state).borrow() as working:
        if settings.rule in QUEUE_RULES:
            return _plan_for_queue(working, snapshot, report, job, now, settings, demand)
        return _plan_for_pending(working, snapshot, report, job, now, settings)


def _movable(working: KeptState, snapshot: FleetSnapshot, state: FleetState, mig: set[str],
             is_mig: np.ndarray, now: float, settings: PlanSettings
             ) -> tuple[dict[int, list[tuple[Allocation, _Where]]], dict[int, list[int]]]:
    """candidates()'s and cpu_only_candidates()' jobs past min_runtime, per node (each becomes
    a Candidate, its cost at ``now``, only on a node tried: most nodes are not), and per such
    node the nodes its jobs may not go to: another pool's, or a MIG node (``mig``: the
    snapshot's :func:`mig_nodes`, ``is_mig`` per node)."""
    barred = {int(p): np.flatnonzero((state.pool != p) | is_mig).tolist() for p in np.unique(state.pool)}
    movable: dict[int, list[tuple[Allocation, _Where]]] = {}
    least = settings.min_runtime_seconds
    pairs = _movable_jobs(snapshot, state, settings, working.layout, mig)
    if least > 0:
        # a job's age, max(0, now - began), reaches a positive least only where now - began
        # does, and a job that states no start is of age 0: the same test, in one comprehension
        # (at least 0, every job passes it)
        pairs = [p for p in pairs if (began := p[0].start_time) is not None and now - began >= least]
    for pair in pairs:
        found = movable.get(pair[1].node)
        if found is None:
            movable[pair[1].node] = [pair]
        else:
            found.append(pair)
    pool = state.pool.tolist()  # read per node: a list, not numpy scalars
    return movable, {n: barred[pool[n]] for n in movable}


def _plan_for_pending(working: KeptState, snapshot: FleetSnapshot, report: Report, job: JobRequest,
                      now: float, settings: PlanSettings) -> CompactionPlan | None:
    state, cw = report.state, report.workload
    placer = working.placer_for(state, cw)
    mig = mig_nodes(snapshot)
    is_mig = np.array([name in mig for name in state.names], dtype=bool)
    target = _pending(state, job, is_mig)
    if target is None:
        return None
    log: list[tuple[bool, Placement]] = []
    if _place_parts(placer, target, log):
        _undo(placer, log)
        return None  # it fits now: the scheduler will start it
    movable, barred_of = _movable(working, snapshot, state, mig, is_mig, now, settings)
    kept: list[tuple[Candidate, Placement]] = []
    per_namespace: Counter[str] = Counter()
    try:
        if not (_parts_could_fit(placer, target, movable, settings)
                and _plan_job(placer, target, movable, now, settings, kept, per_namespace, barred_of, log,
                              _Rooms(placer))):
            return None
    finally:
        _undo(placer, log)
    before = _prediction(report, "cluster", state, cw)
    for c, destination in kept:  # the fleet once the moves are made, the job not yet started
        placer.release(c.current)
        log.append((False, c.current))
        placer.apply(destination)
        log.append((True, destination))
    try:
        after = _prediction(report, "cluster", placer.state, cw)
        blocked = blocked_pending(Placer(state, None), state, snapshot.pending, is_mig)
        started = starts(placer, [target, *(b for b in blocked if b.job.job != job.job)])
    finally:
        _undo(placer, log)
    if not started or started[0] is not job:
        return None  # the moves as placed leave it no room after all (never expected)
    migrations = tuple(_migration(c, d, now, settings) for c, d in kept)
    waited = "" if job.submit_time is None else f", waiting {max(0.0, now - job.submit_time) / 60:.0f} min"
    reasons = (f"lets pending job {job.job} start ({job.gpu_count * job.gpu_share:g} GPUs"
               f"{'' if target.parts == 1 else f' on {target.parts} nodes'}{waited}): "
               f"{len(migrations)} move{'s' if len(migrations) != 1 else ''} free "
               f"{', '.join(sorted({c.current.node_name for c, _ in kept}))} for it",)
    return CompactionPlan(
        scope="cluster", snapshot_time=snapshot.taken_at, expires_at=now + settings.ttl_seconds,
        decision="compact", reasons=reasons, before=before, after=after, migrations=migrations,
        lets_start=tuple(s.job for s in started), gpu_hours_waiting_saved=waiting_saved(started, now))


def _cheapest_node(placer: Placer, target: _Pending, excluded: list[int],
                   movable: dict[int, list[tuple[Allocation, _Where]]], now: float,
                   settings: PlanSettings, kept: list[tuple[Candidate, Placement]],
                   per_namespace: Counter[str], barred: dict[int, list[int]], rooms: _Rooms
                   ) -> tuple[int, list[tuple[Candidate, Placement]], Placement] | None:
    """The node of the part that needs the fewest moves; ``barred`` the nodes each node's jobs
    may not move to (other pools, MIG)."""
    moved = {c.alloc.job for c, _ in kept}
    budget = settings.max_migrations - len(kept)
    need = target.task.gpu_demand
    free = placer.gpu_free.sum(axis=1)
    ok = np.ones(len(placer.names), dtype=bool)
    ok[excluded] = False
    nodes = []
    for n, pairs in movable.items():
        if not ok[n]:
            continue
        jobs = [(alloc, where) for alloc, where in pairs if alloc.job not in moved]
        if jobs and free[n] + sum(where.demand for _, where in jobs) >= need - 1e-9:
            nodes.append((max(0.0, need - free[n]), n, jobs))
    nodes.sort(key=lambda t: (t[0], t[1]))
    best: tuple[int, list[tuple[Candidate, Placement]], Placement] | None = None
    for _, node, jobs in nodes[:PENDING_NODES_TRIED]:
        limit = budget if best is None else len(best[1]) - 1
        if limit <= 0:
            break
        # _evacuate_for would move them all and find no room: the same None, sooner (on the
        # simulated fleet 2 of 5 evacuations, half their time)
        if not room_after_moves(free[node], (where.demand for _, where in jobs), limit, target.task):
            continue
        movers = [where.candidate(alloc, now, settings) for alloc, where in jobs]
        found = _evacuate_for(placer, node, movers, limit, target.task, settings, per_namespace, barred[node],
                              rooms)
        if found is not None and (best is None or len(found[0]) < len(best[1])):
            best = (node, found[0], found[1])
    return best


def _evacuate_for(placer: Placer, node: int, jobs: list[Candidate], limit: int, task: Task,
                  settings: PlanSettings, per_namespace: Counter[str], barred: list[int], rooms: _Rooms
                  ) -> tuple[list[tuple[Candidate, Placement]], Placement] | None:
    """Move ``node``'s jobs off it, largest first, until ``task`` fits there; taken back after.

    Largest by GPUs while the node has too few GPUs free for the task (CPU-only jobs last),
    else by CPUs (its GPUs are free: CPUs are what it lacks)."""
    log: list[tuple[bool, Placement]] = []
    plan: list[tuple[Candidate, Placement]] = []
    spent: Counter[str] = Counter()
    if placer.gpu_free[node].sum() < task.gpu_demand - 1e-9:
        order = sorted(jobs, key=lambda c: (-c.task.gpu_demand, -c.task.cpus, c.cost, c.alloc.job))
    else:
        order = sorted(jobs, key=lambda c: (-c.task.cpus, c.cost, c.alloc.job))
    try:
        for c in order:
            part = placer.place_on(task, node, "bestfit")
            if part is not None:
                return plan, part
            if len(plan) >= limit:
                return None
            if per_namespace[c.alloc.namespace] + spent[c.alloc.namespace] >= settings.max_per_namespace:
                continue
            placer.release(c.current)
            log.append((False, c.current))
            if not _room_elsewhere(rooms, c.task, barred, node):
                return None  # place() would find no node: the same None without scoring the fleet
            destination = placer.place(c.task, "fgd", exclude=[*barred, node])
            if destination is None:
                return None
            placer.apply(destination)
            log.append((True, destination))
            plan.append((c, destination))
            spent[c.alloc.namespace] += 1
        part = placer.place_on(task, node, "bestfit")
        return (plan, part) if part is not None else None
    finally:
        _undo(placer, log)


class _Rooms:
    """:meth:`Placer.room`'s answers on one placer, per task, for :func:`_room_elsewhere`: each
    kept with the free CPUs, GPUs and memory it was read from."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self.kept: dict[Task, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = {}


def _room_elsewhere(rooms: _Rooms, task: Task, barred: list[int], node: int) -> bool:
    """Whether ``task`` has room on a node but ``node`` and ``barred``: where it has none,
    :meth:`Placer.place` finds nothing whatever the policy. Most evacuations for a head that
    cannot start end at their first move, its largest job having nowhere to go, and this
    answers that without ``fgd`` scoring every node the job's shape may use. The answer read
    for the task before stands while every other node's free room is as it was then, to the
    bit (an evacuation taken back leaves it so): the nodes tried for one part ask it again
    for the jobs of one shape."""
    placer = rooms.placer
    found = rooms.kept.get(task)
    if found is not None:
        fits, cpu, gpu, memory = found
        changed = (placer.cpu_free != cpu) | (placer.gpu_free != gpu).any(axis=1)
        if memory is not None and placer.memory_free is not None:
            changed |= placer.memory_free != memory
        changed[barred] = False
        changed[node] = False
        if changed.any():
            found = None
    if found is None:
        fits = placer.room(task, "fgd")
        memory = None if placer.memory_free is None else placer.memory_free.copy()
        rooms.kept[task] = (fits, placer.cpu_free.copy(), placer.gpu_free.copy(), memory)
    elsewhere = fits.copy()
    elsewhere[barred] = False
    elsewhere[node] = False
    return bool(elsewhere.any())


def _prediction(report: Report, scope: str, state: FleetState, cw: CompiledWorkload) -> Prediction:
    tot = totals(state, cw)
    cluster, pool_index, _ = scorer(state, report.settings).scores(tot)
    if scope.startswith("pool:"):
        p = state.pool_names.index(scope.removeprefix("pool:"))
        return Prediction(round(float(pool_index[p]), 6), round(float(tot.pool_fragmented[p]), 6))
    return Prediction(round(cluster, 6), round(tot.cluster_fragmented, 6))


def _migration(c: Candidate, destination: Placement, now: float, settings: PlanSettings) -> Migration:
    action, wait_until = _action(c, now, settings)
    why = (f"frees {c.current.node_name} GPUs {list(c.current.gpus)} for larger jobs; "
           f"{destination.node_name} GPUs {list(destination.gpus)} verified free") if c.current.gpus else (
        f"frees {c.current.cpus:g} CPUs on {c.current.node_name} for a GPU job; "
        f"{destination.node_name} has them free")
    return Migration(
        job=c.alloc.job, namespace=c.alloc.namespace, pod=c.alloc.pod,
        source=Endpoint(c.current.node_name, c.current.gpus),
        destination=Endpoint(destination.node_name, destination.gpus),
        action=action, wait_until=wait_until, cost_gpu_seconds=round(c.cost, 3),
        gpu_share=c.current.gpu_share if c.current.gpus else 1.0, cpus=c.current.cpus, reason=why,
    )


def apply_plan(snapshot: FleetSnapshot, plan: CompactionPlan) -> FleetSnapshot:
    """The snapshot as it will be once every migration of ``plan`` is carried out."""
    by_job = {a.job: a for a in snapshot.allocations}
    for move in plan.migrations:
        alloc = by_job[move.job]
        (part,) = alloc.placements
        if part.node != move.source.node or tuple(part.gpus) != tuple(move.source.gpus):
            raise ValueError(f"{move.job} is not where the plan says it is")
        moved = dataclasses.replace(part, node=move.destination.node, gpus=tuple(move.destination.gpus))
        by_job[alloc.job] = dataclasses.replace(alloc, placements=(moved,))
    return dataclasses.replace(snapshot, allocations=tuple(by_job[a.job] for a in snapshot.allocations))


# -- planning past the head ---------------------------------------------------------------
#
# A plan for the head alone misses whatever the head does not need: the advisor looks every
# few minutes, and the next blocked job waits for the next look, or for capacity. The queue
# rule goes on down the queue with the moves left in the budget, and keeps the account of
# what the plan costs: the work its moves lose and restore, and the jobs it leaves no room for.


@dataclass(frozen=True)
class QueuePlan(CompactionPlan):
    """A plan under the queue rule, with its account (GPU-hours), for the engine to judge.

    ``gpu_hours_waiting_saved`` stays the expected waiting of ``lets_start`` (the jobs it lets
    start that would not start on the fleet as it is, :func:`waiting_saved`); beside it:
    ``work_gpu_hours``, what its moves cost (the work since each moved job's checkpoint, and
    its restore on the destination's GPUs), and ``displaced_gpu_hours``, the same estimate of
    waiting for the pending jobs that would start on the fleet as it is and find no room
    once the plan is carried out (``displaced``): the cost to the jobs it does not plan for.
    Not written on the wire: a receiver gets the plan, the engine the account.
    """

    work_gpu_hours: float = 0.0
    displaced: tuple[str, ...] = ()
    displaced_gpu_hours: float = 0.0
    gpus_started: float = 0.0  # GPUs the jobs in lets_start ask for
    # under the "starts" rule (:func:`backfill_lost`): the small jobs expected to start in the
    # room the plan takes before the next plan, were it not made; None: not counted
    starts_lost: float | None = None
    # under the "horizon" rule (:func:`small_wait_caused`): the small jobs' GPU-hours of waiting
    # the room the plan takes causes while the head holds it (``horizon_seconds``); None: not counted
    small_wait_gpu_hours: float | None = None
    horizon_seconds: float | None = None
    # under "horizon-room" (:func:`reservation_held`): the GPUs the head's reservation keeps from
    # the small jobs already, not counted in the room the plan takes; None: not counted
    reserved_gpus: float | None = None
    # under "horizon-surge" (:func:`exporter.advisor.surge.shortfall`), for a plan that starts a
    # whole-node job: GPUs of the small jobs' forecast rise over the head's horizon that the free
    # GPUs it leaves cannot hold (0: they can), and that rise; None: not counted, or no forecast yet
    surge_gpus: float | None = None
    surge_rise_gpus: float | None = None


def work_cost(moves: Iterable[tuple[Candidate, Placement]], settings: PlanSettings) -> float:
    """GPU-hours a set of moves costs: each job's work since its checkpoint, and its restore
    (its GPUs held, doing nothing, for ``restore_seconds``)."""
    seconds = 0.0
    for c, _ in moves:
        gpus = len(c.current.gpus) * c.current.gpu_share
        seconds += c.cost + gpus * settings.restore_seconds
    return seconds / 3600


def _small_started(snapshot: FleetSnapshot, now: float) -> float:
    """GPUs of the small jobs started in the last :data:`STARTS_LOOKBACK` seconds."""
    since = now - STARTS_LOOKBACK
    flow = 0.0
    for alloc in snapshot.allocations:
        if alloc.start_time is None or alloc.start_time < since or alloc.start_time > now:
            continue
        share = min((p.gpu_share for p in alloc.placements), default=1.0)
        size = alloc.gpu_count * share
        if _small(size, len(alloc.placements)):
            flow += size
    return flow


def backfill_lost(snapshot: FleetSnapshot, taken_gpus: float, started: Iterable[str], now: float,
                  horizon: float) -> float:
    """Small jobs expected to start, before the next plan, in room a plan takes: the starts it
    costs, to set against those it makes.

    Without the plan the head waits, and the scheduler backfills the small jobs
    (:data:`SMALL_GPUS`) queued behind it into the room as it frees; with it, the head holds
    that room. How many: the small jobs queued (but those that start now, with the plan or
    without it, ``started``), and no more than the plan takes (``taken_gpus``) nor than the
    small jobs' flow fills over
    ``horizon``, read from the fleet as it is (the GPUs of the small jobs that started in the
    last :data:`STARTS_LOOKBACK` seconds, as a rate); in jobs of the queued small jobs' mean
    size. 0 when none is queued or none started lately."""
    if taken_gpus <= 0:
        return 0.0
    skip = set(started)
    queued = jobs = 0.0
    for job in snapshot.pending[:PENDING_CHECKED]:
        size = job.gpu_count * job.gpu_share
        if job.job not in skip and _small(size, max(1, job.node_count)):
            queued += size
            jobs += 1
    flow = _small_started(snapshot, now)
    if jobs == 0 or flow == 0:
        return 0.0
    room = min(taken_gpus, queued, flow * horizon / STARTS_LOOKBACK)
    return round(room / (queued / jobs), 3)


def _small_queued(snapshot: FleetSnapshot, started: Iterable[str]) -> bool:
    """Whether a small job (:data:`SMALL_GPUS`) of the first :data:`PENDING_CHECKED` pending,
    but ``started``, waits."""
    skip = set(started)
    return any(job.job not in skip and _small(job.gpu_count * job.gpu_share, max(1, job.node_count))
               for job in snapshot.pending[:PENDING_CHECKED])


def expected_runtime(snapshot: FleetSnapshot, job: JobRequest, now: float, cap: float) -> float:
    """Seconds pending ``job`` is expected to run once started, at most ``cap``: the median
    age of the running jobs of its kind (small, :data:`SMALL_GPUS`, or not), since a job
    request states no run time. ``cap`` when none of its kind runs."""
    small = _small(job.gpu_count * job.gpu_share, max(1, job.node_count))
    ages = [now - a.start_time for a in snapshot.allocations
            if a.start_time is not None and a.start_time <= now
            and _small(a.gpu_count * min((p.gpu_share for p in a.placements), default=1.0),
                       len(a.placements)) == small]
    if not ages:
        return cap
    return min(cap, float(np.median(ages)))


def small_wait_caused(snapshot: FleetSnapshot, taken_gpus: float, started: Iterable[str],
                      now: float, horizon: float) -> float:
    """GPU-hours of waiting a plan causes the small jobs (:data:`SMALL_GPUS`) by holding the
    room it takes (``taken_gpus``) for ``horizon`` seconds, the time the head it starts runs.

    Without the plan the scheduler backfills that room with small jobs: those queued now
    (but ``started``, which start now with the plan or without it) and those the small jobs'
    flow (the last :data:`STARTS_LOOKBACK` seconds' starts, as a rate) brings over the
    horizon, no more than the room holds. With it, they wait for the head to end: the queued
    ones the whole horizon, those arriving during it half of it on average. Counted once per
    GPU of room, not per turn of the room, so it is the least the plan costs them."""
    if taken_gpus <= 0 or horizon <= 0:
        return 0.0
    skip = set(started)
    queued = sum(job.gpu_count * job.gpu_share for job in snapshot.pending[:PENDING_CHECKED]
                 if job.job not in skip and _small(job.gpu_count * job.gpu_share, max(1, job.node_count)))
    waiting_now = min(taken_gpus, queued)
    arriving = min(taken_gpus - waiting_now, _small_started(snapshot, now) / STARTS_LOOKBACK * horizon)
    return round((waiting_now * horizon + arriving * horizon / 2) / 3600, 3)


def reservation_held(state: FleetState, head: _Pending) -> float:
    """GPUs a blocked head's reservation keeps from the small jobs already, plan or no plan.

    A FIFO scheduler with backfill (Slurm's, the simulator's) reserves for a blocked head the
    nodes it could start on soonest, and backfills small jobs onto them only where they end by
    then. A plan that starts the head takes its GPUs; the free ones on the reserved nodes were
    out of the small jobs' reach while it waited (with the plan the head uses them, or they are
    released when its reservation ends), so only the rest of the room is theirs to lose. A
    snapshot states no job's end, so the reserved nodes are taken to be the ``parts`` allowed
    nodes with the most free GPUs the head can use (each counted up to its part's GPUs): the
    most a reservation can hold now, so the room left is the least a plan takes from them. The
    small jobs that would end by the head's start, and so may still use the reserved nodes,
    are not counted."""
    task = head.task
    if task.gpus <= 0:
        return 0.0
    need = 1.0 if task.gpu_share >= 1.0 - 1e-9 else task.gpu_share
    allowed = np.ones(len(state.names), dtype=bool)
    allowed[head.excluded] = False
    usable = (state.gpu_free[allowed] >= need - 1e-9).sum(axis=1)
    held = np.sort(np.minimum(usable, task.gpus))[::-1][:head.parts]
    return round(float(held.sum()) * task.gpu_share, 6)


def _queue_behind(state: FleetState, pending: Sequence[JobRequest], head: JobRequest, is_mig: np.ndarray,
                  barred: dict[tuple, list[int]]) -> list[_Pending]:
    """The pending jobs asking GPUs behind ``head``, in the source's order, of the first
    :data:`PENDING_CHECKED`, as the placer sees them (none when the source does not list
    ``head``); ``barred`` as :func:`_pending`'s."""
    listed = pending[:PENDING_CHECKED]
    at = next((i for i, job in enumerate(listed) if job is head or job.job == head.job), None)
    behind = () if at is None else listed[at + 1:]
    return [p for job in behind if (p := _pending(state, job, is_mig, barred)) is not None]


def _fitting(placer: Placer, queue: Sequence[_Pending], skip: set[str],
             log: list[tuple[bool, Placement]]) -> list[JobRequest]:
    """The jobs of ``queue`` (but ``skip``) that start on the placer in turn, in the queue's
    order, each placed (applied, logged) so the next sees it; shapes that found no room are
    not tried again."""
    out = []
    failed: set[tuple] = set()
    for p in queue:
        if p.job.job in skip:
            continue
        key = (p.task, p.parts, tuple(p.excluded))
        if key in failed:
            continue
        if _place_parts(placer, p, log):
            out.append(p.job)
        else:
            failed.add(key)
    return out


def plan_for_queue(snapshot: FleetSnapshot, report: Report, job: JobRequest, now: float,
                   settings: PlanSettings = PlanSettings(), kept_state: KeptState | None = None,
                   demand: SmallDemand | None = None) -> QueuePlan | None:
    """The queue rule: :func:`plan_for_pending`'s plan for the head ``job``, then, in the
    queue's order, for the next blocked jobs (up to :data:`QUEUE_JOBS` in all), within the
    same budget of moves, on the working copy the earlier moves and jobs left.

    Walking the queue from the head as the scheduler would start it: a job that fits is
    placed (it takes its room before the jobs behind it); one that does not gets the fewest
    moves after which it fits, kept only when the waiting it ends (:func:`waiting_saved`) is
    at least ``min_saved_per_work`` times the work those moves cost (:func:`work_cost`);
    the first blocked job no kept moves start ends the planning (behind it, only backfill
    starts jobs). The plan's account (:class:`QueuePlan`) compares the walk with the same
    walk on the fleet as it is: the jobs that start only with the plan are ``lets_start``,
    those that start only without it ``displaced``. None when the head fits already or no
    moves let it start. ``demand``: the small jobs' hourly demand, which the
    ``horizon-surge`` rule forecasts from (without it, that rule counts no shortfall).
    """
    with (KeptState() if kept_state is None else kept_state).borrow() as working:
        return _plan_for_queue(working, snapshot, report, job, now, settings, demand)


def _plan_for_queue(working: KeptState, snapshot: FleetSnapshot, report: Report, job: JobRequest,
                    now: float, settings: PlanSettings, demand: SmallDemand | None = None
                    ) -> QueuePlan | None:
    state, cw = report.state, report.workload
    placer = working.placer_for(state, cw)
    mig = mig_nodes(snapshot)
    is_mig = np.array([name in mig for name in state.names], dtype=bool)
    barred: dict[tuple, list[int]] = {}
    head = _pending(state, job, is_mig, barred)
    if head is None:
        return None
    log: list[tuple[bool, Placement]] = []
    if _place_parts(placer, head, log):
        _undo(placer, log)
        return None  # it fits now: the scheduler will start it
    movable, barred_of = _movable(working, snapshot, state, mig, is_mig, now, settings)
    kept: list[tuple[Candidate, Placement]] = []
    per_namespace: Counter[str] = Counter()
    planned: list[JobRequest] = []
    with_plan: list[JobRequest] = []  # the jobs that start, in order, with the plan
    queue = [head]
    rooms = _Rooms(placer)

    def walk() -> Iterator[_Pending]:
        """The queue from the head; the jobs behind it worked out only once the head has
        moves that let it start (most calls end at the head)."""
        yield head
        queue.extend(_queue_behind(state, snapshot.pending, job, is_mig, barred))
        yield from queue[1:]

    try:
        planning = True
        failed: set[tuple] = set()
        for p in walk():
            key = (p.task, p.parts, tuple(p.excluded))
            # a one-part head placed nothing above, on these same arrays: it fits no better now
            tried = p is head and p.parts == 1
            if key not in failed and not tried and _place_parts(placer, p, log):
                with_plan.append(p.job)
                continue
            if not planning:
                failed.add(key)
                continue
            mark, moved_before = len(log), len(kept)
            # the head's search ends the call where it fails: a necessary test first
            if (planned or _parts_could_fit(placer, p, movable, settings)) and _plan_job(
                    placer, p, movable, now, settings, kept, per_namespace, barred_of, log, rooms):
                moves = kept[moved_before:]
                saved = waiting_saved((p.job,), now)
                if not planned or saved >= settings.min_saved_per_work * work_cost(moves, settings):
                    planned.append(p.job)
                    with_plan.append(p.job)
                    planning = len(planned) < QUEUE_JOBS and len(kept) < settings.max_migrations
                    continue
                for c, _ in moves:  # it does not pay: taken back, and the planning ends
                    per_namespace[c.alloc.namespace] -= 1
                del kept[moved_before:]
                _undo_to(placer, log, mark)
            if not planned:
                return None  # no moves let the head start
            planning = False
            failed.add(key)
    finally:
        _undo(placer, log)
    plain = Placer(state, None)
    try:
        without = _fitting(plain, queue, set(), log)
    finally:
        _undo(plain, log)
    before = _prediction(report, "cluster", state, cw)
    for c, destination in kept:  # the fleet once the moves are made, no job started yet
        placer.release(c.current)
        log.append((False, c.current))
        placer.apply(destination)
        log.append((True, destination))
    try:
        after = _prediction(report, "cluster", placer.state, cw)
    finally:
        _undo(placer, log)
    started_without = {j.job for j in without}
    started_with = {j.job for j in with_plan}
    lets = [j for j in with_plan if j.job not in started_without]
    displaced = [j for j in without if j.job not in started_with]
    if not lets or lets[0].job != job.job:
        return None  # the head starts without the plan after all (never expected)
    migrations = tuple(_migration(c, d, now, settings) for c, d in kept)
    work = work_cost(kept, settings)
    saved = waiting_saved(lets, now)
    lost = waiting_saved(displaced, now)
    gpus = sum(j.gpu_count * j.gpu_share for j in lets)
    lost_starts = None
    if settings.rule == "starts":
        taken = gpus - sum(j.gpu_count * j.gpu_share for j in displaced)
        lost_starts = backfill_lost(snapshot, taken, started_with | started_without, now,
                                    settings.starts_horizon_seconds)
    small_wait = horizon = reserved = surge = rise = None
    if settings.rule in ("horizon", *ROOM_RULES):
        taken = gross = gpus - sum(j.gpu_count * j.gpu_share for j in displaced)
        if settings.rule in ROOM_RULES:
            reserved = reservation_held(state, queue[0])
            taken = max(0.0, taken - reserved)
        horizon = expected_runtime(snapshot, job, now, settings.horizon_cap_seconds)
        small_wait = small_wait_caused(snapshot, taken, started_with | started_without, now, horizon)
        if settings.rule in SURGE_RULES and demand is not None and any(
                not _small(j.gpu_count * j.gpu_share, max(1, j.node_count)) for j in lets) and (
                settings.rule == "horizon-surge"
                or not _small_queued(snapshot, started_with | started_without)):
            # the whole room it takes, the reservation's included: the surge needs free GPUs
            # anywhere, and a reservation ends when its head starts
            rise = demand.rise(horizon)
            surge = shortfall(rise, free_gpus(state.gpu_free), gross)
    waited = "" if job.submit_time is None else f", waiting {max(0.0, now - job.submit_time) / 60:.0f} min"
    parts = max(1, job.node_count)
    reasons = [f"lets pending job {job.job} start ({job.gpu_count * job.gpu_share:g} GPUs"
               f"{'' if parts == 1 else f' on {parts} nodes'}{waited}), and {len(lets) - 1} "
               f"more behind it: {len(migrations)} move{'s' if len(migrations) != 1 else ''} free "
               f"{', '.join(sorted({c.current.node_name for c, _ in kept}))}",
               f"ends {saved:g} GPU-hours of waiting for {work:.3g} GPU-hours of work lost and "
               f"restored" + (f"; {len(displaced)} pending job{'s' if len(displaced) != 1 else ''} "
                              f"that would start now would wait ({lost:g} GPU-hours)" if displaced else "")]
    return QueuePlan(
        scope="cluster", snapshot_time=snapshot.taken_at, expires_at=now + settings.ttl_seconds,
        decision="compact", reasons=tuple(reasons), before=before, after=after, migrations=migrations,
        lets_start=tuple(j.job for j in lets), gpu_hours_waiting_saved=saved,
        work_gpu_hours=round(work, 3), displaced=tuple(j.job for j in displaced),
        displaced_gpu_hours=lost, gpus_started=gpus, starts_lost=lost_starts,
        small_wait_gpu_hours=small_wait, horizon_seconds=horizon, reserved_gpus=reserved,
        surge_gpus=surge, surge_rise_gpus=None if rise is None else round(rise, 3))


def _parts_could_fit(placer: Placer, target: _Pending, movable: dict[int, list[tuple[Allocation, _Where]]],
                     settings: PlanSettings) -> bool:
    """False where no moves can let a gang's parts start, before any is searched for; True
    otherwise, and for a job of one part (its search tests the same). For a plan to start
    nothing yet moved for.

    :func:`_cheapest_node` finds each part a node of one model among those it may use, with
    movable jobs, whose free GPUs and its movable jobs' could hold the part, and that
    :func:`room_after_moves` allows within the budget; each part on another node, their
    moves within one budget. Until a node is given a part, moves only take room on it (the
    jobs moved leave the parts' nodes), so each of those tests is passed at the start by
    every node any part can get; and a node needs at least the fewest moves after which
    room_after_moves allows it. So a model must have as many such nodes as the job has
    parts, their fewest moves within the budget. About half the gangs the default simulated
    fleet's planner finds no moves for fail it, a fifth of them after a search had found
    nodes for one or two parts."""
    if target.parts <= 1:
        return True
    budget = settings.max_migrations
    need = target.task.gpu_demand
    free = placer.gpu_free.sum(axis=1)
    ok = np.ones(len(placer.names), dtype=bool)
    ok[target.excluded] = False
    fewest: dict[int, list[int]] = {}  # per model, the fewest moves each node could need
    for n, jobs in movable.items():
        if not ok[n] or not jobs or not free[n] + sum(where.demand for _, where in jobs) >= need - 1e-9:
            continue
        demands = [where.demand for _, where in jobs]
        moves = next((k for k in range(budget + 1)
                      if room_after_moves(free[n], demands, k, target.task)), None)
        if moves is not None:
            fewest.setdefault(int(placer.model[n]), []).append(moves)
    return any(len(m) >= target.parts and sum(sorted(m)[:target.parts]) <= budget for m in fewest.values())


def _plan_job(placer: Placer, target: _Pending, movable: dict[int, list[tuple[Allocation, _Where]]],
              now: float, settings: PlanSettings, kept: list[tuple[Candidate, Placement]],
              per_namespace: Counter[str], barred: dict[int, list[int]],
              log: list[tuple[bool, Placement]], rooms: _Rooms) -> bool:
    """The fewest moves after which ``target`` fits, each part as :func:`plan_for_pending`
    finds it, applied with the job's parts (logged) and added to ``kept``; False, with
    nothing applied, when none exist within the budget left."""
    mark, moved_before = len(log), len(kept)
    excluded = list(target.excluded)
    for _ in range(target.parts):
        best = _cheapest_node(placer, target, excluded, movable, now, settings, kept, per_namespace, barred,
                              rooms)
        if best is None:
            for c, _ in kept[moved_before:]:
                per_namespace[c.alloc.namespace] -= 1
            del kept[moved_before:]
            _undo_to(placer, log, mark)
            return False
        node, moves, part = best
        for c, destination in moves:
            placer.release(c.current)
            log.append((False, c.current))
            placer.apply(destination)
            log.append((True, destination))
            kept.append((c, destination))
            per_namespace[c.alloc.namespace] += 1
        placer.apply(part)
        log.append((True, part))
        if target.parts > 1 and len(excluded) == len(target.excluded):
            excluded.extend(np.flatnonzero(placer.model != placer.model[node]).tolist())
        excluded.append(node)
    return True
