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
permits; a job that states no memory need stays on its current model; a job
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

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.right_sizing import misplacements
from exporter.analysis.fgd import CompiledWorkload
from exporter.analysis.index import Report, scorer, totals
from exporter.analysis.state import FleetState
from exporter.placement.engine import Placement, Placer
from exporter.placement.policies import FgdTies
from exporter.placement.task import Task
from exporter.placement.tiers import tier_models
from exporter.snapshot import Allocation, FleetSnapshot

IMPROVEMENT = 1e-6  # GPUs of F(M) a kept evacuation must save, above float noise
WHOLE_NODE_GPUS = 8  # "whole nodes freed" counts nodes an 8-GPU job could now start on
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


def _slots(state: FleetState, node: int, gpus: Sequence[int]) -> tuple[int, ...] | None:
    row = state.gpu_index[node] if state.gpu_index is not None else np.arange(state.gpu_free.shape[1])
    found = []
    for gpu in gpus:
        where = np.flatnonzero(row == gpu)
        if len(where) == 0:  # the job sits on a GPU that is down: not ours to move
            return None
        found.append(int(where[0]))
    return tuple(found)


def destination_models(alloc: Allocation, current_model: str, fleet_models: Sequence[str]) -> tuple[str, ...]:
    """The models a job may move to: its tier's (by memory need) within its own allowed list.

    Without a stated memory need nothing says another model is safe, so the job
    stays on its current one.
    """
    if alloc.gpu_memory_need_bytes:
        return tier_models(alloc.gpu_memory_need_bytes, fleet_models, alloc.allowed_models)
    if alloc.allowed_models:
        return tuple(m for m in alloc.allowed_models if m == current_model) or ()
    return (current_model,)


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
               settings: PlanSettings, deferred: list[Allocation] | None = None
               ) -> dict[int, list[Candidate]]:
    """Movable jobs per node index, cheapest first.

    A job that could only move after the plan expires goes to ``deferred`` instead.
    """
    by_node: dict[int, list[Candidate]] = {}
    index = {name: i for i, name in enumerate(state.names)}
    mig = mig_nodes(snapshot)
    expires = now + settings.ttl_seconds
    for alloc in snapshot.allocations:
        if len(alloc.placements) != 1:
            continue  # multi-node: never split, and not moved whole by this planner
        if alloc.priority >= settings.high_priority and not settings.move_high_priority:
            continue
        part = alloc.placements[0]
        node = index.get(part.node)
        if node is None or not part.gpus:
            continue  # CPU-only jobs fragment no GPU
        if part.node in mig:
            continue  # it holds MIG slices, which the placer does not model
        slots = _slots(state, node, part.gpus)
        if slots is None:
            continue
        if not 0 < part.gpu_share <= 1 or part.cpus > state.cpu_total[node]:
            # it holds more than its node has: the placer, which clamps at the node's
            # capacity, could not put it back after trying a move ("no longer fits")
            continue
        current_model = state.model_names[int(state.model[node])]
        models = destination_models(alloc, current_model, state.model_names)
        if not models:
            continue
        started = alloc.start_time if alloc.start_time is not None else now
        if max(0.0, now - started) < settings.min_runtime_seconds \
                and started + settings.min_runtime_seconds > expires:
            if deferred is not None:
                deferred.append(alloc)
            continue
        checkpoint = last_checkpoint(alloc, now, settings.checkpoint_interval_seconds)
        since = started if checkpoint is None else max(started, checkpoint)
        gpus = len(part.gpus) * part.gpu_share
        cost = gpus * max(0.0, now - since)
        current = Placement(node, part.node, slots, tuple(part.gpus), part.gpu_share, part.cpus)
        task = dataclasses.replace(Task.from_allocation(alloc, part), models=models)
        by_node.setdefault(node, []).append(
            Candidate(alloc, node, current, task, cost, max(0.0, now - started),
                      checkpoint is not None))
    for jobs in by_node.values():
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
                    settings: PlanSettings = PlanSettings()) -> CompactionPlan:
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
    movable = candidates(snapshot, state, now, settings, deferred)
    # where each pool's jobs may not go: other pools, and MIG-mode nodes
    mig = mig_nodes(snapshot)
    is_mig = np.array([name in mig for name in state.names], dtype=bool)
    barred = {int(p): np.flatnonzero((state.pool != p) | is_mig).tolist()
              for p in np.unique(state.pool)}
    order = source_order(placer.node_fragmented, movable, in_scope)
    whole_before = _whole_free(placer, np.arange(len(state.names)))

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
    )


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
           f"{destination.node_name} GPUs {list(destination.gpus)} verified free")
    return Migration(
        job=c.alloc.job, namespace=c.alloc.namespace, pod=c.alloc.pod,
        source=Endpoint(c.current.node_name, c.current.gpus),
        destination=Endpoint(destination.node_name, destination.gpus),
        action=action, wait_until=wait_until, cost_gpu_seconds=round(c.cost, 3),
        gpu_share=c.current.gpu_share, cpus=c.current.cpus, reason=why,
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
