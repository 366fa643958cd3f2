"""When compaction pays: hysteresis, dwell, cooldown and a gain-per-disruption gate.

Every evaluation yields *advice* (:class:`~exporter.advisor.advice.Advice`): a decision
with its reasons in words, and a plan when one is proposed. The engine decides and never
plans: an evaluation is :meth:`Advisor.assess` (may a plan be proposed, and for which
scope?), the planner run by the caller (:func:`exporter.advisor.advise.advise`), then
:meth:`Advisor.decide` (is that plan worth its disruption?).

Compaction is recommended for a scope (the cluster or one pool) once its index
has stayed above ``trigger`` for ``dwell``; the recommendation clears only when
the index falls below ``clear_below``, so an index hovering around the trigger
doesn't flap. A cooldown separates plans, and a plan is proposed only if it
recovers enough fragmented GPUs, and frees enough whole nodes, per migration:
moving jobs costs work, and a plan that moves ten jobs to recover one GPU is
worse than no plan.

Alertmanager's fragmentation alert has already waited its own ``for`` (15 min
in the table) before it reaches ``POST /v1/alerts``: a firing alert for a
scope counts as its dwell served, so the advisor does not wait a second time.
A plan that would leave its scope above the trigger is still proposed (part of
the way is better than none) but says so in its reasons, with the index it
reaches, so no receiver takes it for the whole cure.

A proposed plan stays in the advice until its ``expires_at``: the evaluations after it
(cooldown, hold, or none once the index has cleared) carry it as ``plan`` with
``plan_proposed_at`` older than ``evaluated_at``, so ``GET /v1/advice`` (and ``gpufleet
plan``) always shows the plan a scheduler may still act on, while ``decision`` says what
this evaluation decided. Only a ``compact`` decision is a new plan, delivered by webhook;
an expired plan is never served, even between evaluations (:meth:`Advisor.current`).

What pays is a move that lets a waiting job start (``gpufleet simulate``, docs/simulate.md:
the index rule alone cut whole-node waiting by 4% where consolidation for the queue's head
cut 63%). So, with ``require_pending`` (the default), where the snapshot says what waits
(:func:`queue_known`): the index plans nothing (a due scope is held: the queue decides);
and when the first pending job asking GPUs would fit in the fleet's idle
GPUs in all but fits nowhere, the planner's :func:`~exporter.advisor.planner.plan_for_pending`
plans the fewest moves after which it starts, proposed as ``compact`` whatever the index
and the dwell (a waiting job is the evidence) if it passes :func:`pending_gate` (the job's
GPUs per migration). Its plan says what it gains in the outcome's units: ``lets_start`` and
``gpu_hours_waiting_saved``.

Besides compaction, every evaluation lists three kinds of waste it never acts on:
jobs holding GPUs they barely use (``reclaim``: below the threshold table's
``GpuJobUtilizationLow`` critical level for its duration, costliest models
first), jobs on a higher memory tier than they need in a pool under pressure
(``right_sizing``, with the GPU-hours they hold), and multi-node jobs spanning
NVLink generations (``nvlink_mixed``: Blackwell's NVLink 5 does not
interconnect with Hopper's NVLink 4).

A job's memory need is the larger of what it declares and the peak GPU memory it
was measured using over its life (``memory_peak``, per GPU, from whole GPUs it
holds alone: a shared GPU's use is not one job's). The peak is a lower bound, so it
only ever raises a declared need: a job that declares none is never moved, nor
listed, on a measurement alone.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter import metrics
from exporter.advisor.advice import (
    Advice,
    AdvisorState,
    Decision,
    NvlinkMixed,
    Reclaim,
    ScopeStatus,
    WhatIf,
)
from exporter.advisor.plan import CompactionPlan
from exporter.advisor.planner import QueuePlan
from exporter.advisor.right_sizing import right_sizing
from exporter.analysis.index import Report
from exporter.analysis.state import FleetState
from exporter.attribution.jobs import GpuJobUse, job_use
from exporter.gpu_catalogue import default_catalogue
from exporter.pool_load.tracker import PoolAdvice
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node
from exporter.thresholds import Thresholds, load_thresholds

IDLE_ROW = "GpuJobUtilizationLow"  # the threshold table's row that says "consider reclaiming"
# sources that list the scheduler's pending jobs (an empty list from them: nothing waits);
# "simulate" is gpufleet simulate's fleet
QUEUE_SOURCES = frozenset({"slurm", "kubernetes", "simulate"})

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class DecisionSettings:
    trigger: float = 50.0
    clear_below: float = 40.0
    dwell_seconds: float = 600.0
    cooldown_seconds: float = 1800.0
    min_recovered_per_migration: float = 0.5
    min_nodes_freed_per_migration: float = 0.0
    # after a hold, planning again on every snapshot (every few seconds, up to a second
    # of CPU on a large fleet each) would find the same nothing; an alert still re-plans at once
    hold_recheck_seconds: float = 60.0
    # the threshold table's row for the pool fragmentation index (rules/thresholds.yaml)
    compaction_alert: str = "GpuClusterFragmentationHigh"
    # and its row for the cluster index: its firing serves the cluster scope's dwell
    cluster_alert: str = "GpuFleetFragmentationHigh"
    # jobs stating no checkpoint do one this often (gpufleet_job_checkpoint_age_seconds); 0: never
    checkpoint_interval_seconds: float = 900.0
    # (utilization ratio, seconds) below which a job's GPUs count as idle: the threshold
    # table's GpuJobUtilizationLow at its highest level; None: the packaged table's (idle_rule)
    idle: tuple[float, float] | None = None
    # the revised rule (docs/simulate.md): where the queue is known (queue_known), a compaction
    # plan must let a pending job start; and a pending job blocked by fragments, not capacity,
    # gets a plan of its own (planner.plan_for_pending). False: the index rule alone
    require_pending: bool = True
    # a plan for the queue (planner.QueuePlan) must end at least this many GPU-hours of
    # waiting, net of the waiting of the jobs it leaves no room for, per GPU-hour of work its
    # moves cost (queue_gate)
    min_saved_per_work: float = 1.0


def idle_rule(table: Thresholds | None = None) -> tuple[float, float]:
    """(utilization ratio, seconds) below which a job's GPUs count as idle: the table's
    GpuJobUtilizationLow at its highest level (critical: 10% for 2 h), read, not written twice.
    ``table``: the one ``serve`` runs on; else, or when it has no such row, the packaged one."""
    if table is None or not any(row.alert == IDLE_ROW for row in table.alerts):
        return _packaged_idle_rule()
    level = table.alert(IDLE_ROW).levels[-1]
    return level.threshold, level.for_seconds


@functools.cache
def _packaged_idle_rule() -> tuple[float, float]:
    level = load_thresholds().alert(IDLE_ROW).levels[-1]
    return level.threshold, level.for_seconds


def _job_utilization(alloc: Allocation, utilization: dict[tuple[str, int], float],
                     own: GpuJobUse | None = None) -> float | None:
    """Mean utilization of the job's GPUs, as the alert averages it; None without telemetry.
    On a GPU it shares, its own processes' SM use where the NVML source read them (``own``):
    the GPU's figure is every tenant's."""
    values = []
    for p in alloc.placements:
        for g in p.gpus:
            mine = own.sm(p.node, g, alloc.job) if own is not None and p.gpu_share < 1 else None
            if mine is not None:
                values.append(mine)
            elif (p.node, g) in utilization:
                values.append(utilization[(p.node, g)])
    return sum(values) / len(values) if values else None


def node_generations(nodes: tuple[Node, ...]) -> dict[str, int]:
    """The NVLink generation of each node whose model has one (catalogue ``nvlink_generation``;
    a model without NVLink or unknown to the catalogue has none), each model looked up once."""
    catalogue = default_catalogue()
    models = {n.name: n.model for n in nodes}
    generation = {model: spec.nvlink_generation if (spec := catalogue.find(model)) is not None else None
                  for model in set(models.values())}
    return {name: g for name, model in models.items() if (g := generation[model]) is not None}


def nvlink_generations(snapshot: FleetSnapshot, of_nodes: dict[str, int] | None = None
                       ) -> list[tuple[Allocation, list[int]]]:
    """Each multi-node job with the NVLink generations of its nodes' GPUs (a node not in the
    snapshot adds none). ``of_nodes``: the snapshot's :func:`node_generations`, when the
    caller keeps them."""
    of = node_generations(snapshot.nodes) if of_nodes is None else of_nodes
    # most jobs are on one node: filtered in one comprehension, not a loop step each
    return [(alloc, sorted({g for part in alloc.placements if (g := of.get(part.node)) is not None}))
            for alloc in [a for a in snapshot.allocations if len(a.placements) > 1]]


def nvlink_mixed(snapshot: FleetSnapshot, of_nodes: dict[str, int] | None = None
                 ) -> tuple[NvlinkMixed, ...]:
    """Multi-node jobs whose nodes have GPUs of more than one NVLink generation (``of_nodes``:
    the snapshot's :func:`node_generations`, when the caller keeps them)."""
    out = []
    for alloc, generations in nvlink_generations(snapshot, of_nodes):
        if len(generations) > 1:
            out.append(NvlinkMixed(
                alloc.job, alloc.namespace, tuple(alloc.nodes), tuple(generations),
                f"one job over NVLink generations {generations}: "
                "they do not interconnect, so its traffic falls back to the network"))
    return tuple(sorted(out, key=lambda r: r.job))


@dataclass(frozen=True, slots=True)
class GpuReads:
    """What an evaluation reads of a snapshot's GPUs: memory used on whole GPUs, utilisation,
    each shared GPU's tenants. A function of ``gpus`` alone, so an advisor keeps it while
    the snapshots it gets share one tuple of GPUs (the simulator's fleet does)."""

    gpus: tuple[Gpu, ...]
    memory_used: dict[tuple[str, int], int]
    utilization: dict[tuple[str, int], float]
    own: GpuJobUse


def gpu_reads(gpus: tuple[Gpu, ...]) -> GpuReads:
    return GpuReads(
        gpus,
        {g.key: g.memory_used_bytes for g in gpus if g.up and not g.mig and g.memory_used_bytes is not None},
        {g.key: g.utilization_ratio for g in gpus if g.up and g.utilization_ratio is not None},
        job_use(gpus))


def memory_peaks(snapshot: FleetSnapshot, previous: dict[str, float],
                 reads: GpuReads | None = None) -> dict[str, float]:
    """Each running job's peak GPU memory use per GPU so far: this snapshot's and the one before.

    Whole, non-MIG GPUs count (``gpu_share`` 1): a shared GPU's memory is several jobs'.
    On a shared GPU whose processes the NVML source read, the job's own processes' memory
    counts. Rebuilt from the snapshot's jobs, so a job that ends is forgotten at once and
    the state never holds more than the fleet's running jobs. ``reads``: the snapshot's
    GPUs' (:func:`gpu_reads`), when the caller holds them.
    """
    if reads is None or reads.gpus is not snapshot.gpus:
        reads = gpu_reads(snapshot.gpus)
    used, own = reads.memory_used, reads.own
    out: dict[str, float] = {}
    if not used and not previous and not own.jobs:
        return out  # nothing measured, now or before (a scheduler's view alone)
    for alloc in snapshot.allocations:
        values = [float(used[(p.node, gpu)]) for p in alloc.placements if p.gpu_share >= 1.0
                  for gpu in p.gpus if (p.node, gpu) in used]
        values += [float(mine) for p in alloc.placements if p.gpu_share < 1.0 for gpu in p.gpus
                   if (mine := own.memory(p.node, gpu, alloc.job)) is not None]
        before = previous.get(alloc.job)
        if before is not None:
            values.append(before)
        if values:
            out[alloc.job] = max(values)
    return out


def with_measured_needs(snapshot: FleetSnapshot, peaks: dict[str, float]) -> FleetSnapshot:
    """The snapshot with each declared memory need raised to the job's measured peak where
    that is higher; a job that declares none keeps none (a peak is a lower bound)."""
    if not peaks:
        return snapshot
    changed = False
    allocations = []
    for alloc in snapshot.allocations:
        peak = peaks.get(alloc.job)
        if alloc.gpu_memory_need_bytes and peak is not None and peak > alloc.gpu_memory_need_bytes:
            alloc = dataclasses.replace(alloc, gpu_memory_need_bytes=int(peak))
            changed = True
        allocations.append(alloc)
    return dataclasses.replace(snapshot, allocations=tuple(allocations)) if changed else snapshot


def queue_known(snapshot: FleetSnapshot) -> bool:
    """Whether the snapshot says what waits: it lists pending jobs, or a source that lists
    them (:data:`QUEUE_SOURCES`) is up. Without one (GPU telemetry alone) nothing says no job
    waits, so the revised rule cannot hold a plan for starting none: the index rule stands."""
    return bool(snapshot.pending) or any(st.up and st.source in QUEUE_SOURCES for st in snapshot.sources)


@dataclass
class ScopeState:
    index: float = 0.0
    above_since: float | None = None
    recommended: bool = False


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _scope_name(scope: str) -> str:
    return "cluster" if scope == "cluster" else f"pool {scope.removeprefix('pool:')}"


def scope_indices(report: Report) -> dict[str, float]:
    indices = {"cluster": report.cluster.index}
    for pool in report.pools:
        indices[f"pool:{pool.name}"] = pool.index
    return indices


def inversion_penalties(report: Report) -> dict[str, float]:
    """Each scope's tier-inversion penalty (points of its index): what no compaction recovers."""
    penalties = {"cluster": float(getattr(report.cluster, "penalty", 0.0))}
    for pool in report.pools:
        penalties[f"pool:{pool.name}"] = float(getattr(pool, "penalty", 0.0))
    return {k: v for k, v in penalties.items() if v > 0}


def inversion_remedy(report: Report, scope: str, index: float, penalty: float) -> str:
    """What to do about a scope whose index is high from tier inversion, in words: moves
    within a tier recover none of it; the next jobs that fit the idle tier should go there."""
    pairs = [i for i in getattr(report, "inversions", ()) if i.inverted
             and (scope == "cluster" or scope == f"pool:{i.upper}")]
    said = "; ".join(f"{i.upper} idle while {i.lower} is {i.lower_allocated:.0%} allocated" for i in pairs)
    uppers = ", ".join(dict.fromkeys(i.upper for i in pairs)) or "the idle tier"
    return (f"{_scope_name(scope)} index {index:.0f} includes {penalty:.0f} points of tier inversion"
            f"{f' ({said})' if said else ''}, {index - penalty:.0f} without: compaction recovers "
            f"none of it, so it is no reason to compact; remedy: steer the next jobs that fit "
            f"{uppers} there (every job a lower tier holds fits a higher tier's memory), "
            f"{metrics.TIER_INVERSION.name} says while it lasts")


def gate(plan: CompactionPlan, settings: DecisionSettings) -> str | None:
    """None when the plan is worth its disruption, else why not."""
    moves = len(plan.migrations)
    if moves == 0:
        return None
    recovered = plan.fragmented_gpus_recovered / moves
    freed = sum(plan.nodes_freed.values()) / moves
    if recovered < settings.min_recovered_per_migration:
        return (f"plan recovers {plan.fragmented_gpus_recovered:.1f} fragmented GPUs with {moves} "
                f"migrations ({recovered:.2f} per migration < {settings.min_recovered_per_migration:g})")
    if freed < settings.min_nodes_freed_per_migration:
        return (f"plan frees {sum(plan.nodes_freed.values())} whole nodes with {moves} migrations "
                f"({freed:.2f} per migration < {settings.min_nodes_freed_per_migration:g})")
    return None


def shortfall(plan: CompactionPlan, settings: DecisionSettings) -> str | None:
    """None when the plan brings its scope's index to the trigger or below, else how far it gets."""
    if plan.after.index <= settings.trigger:
        return None
    return (f"partial plan: {_scope_name(plan.scope)} index {plan.before.index:.1f} -> "
            f"{plan.after.index:.1f}, still above the trigger {settings.trigger:g} within the "
            f"migration budget; the recommendation stays, and another plan may follow the cooldown")


def pending_gate(plan: CompactionPlan, job: JobRequest, settings: DecisionSettings) -> str | None:
    """None when a plan for a pending job is worth its disruption: the gain per migration is
    the job's GPUs (what it lets run; under the queue rule, every job's it lets start), held
    to the same ``min_recovered_per_migration``; and a queue rule's plan must pass
    :func:`queue_gate`."""
    moves = len(plan.migrations)
    queue = isinstance(plan, QueuePlan)
    gpus = plan.gpus_started if isinstance(plan, QueuePlan) else job.gpu_count * job.gpu_share
    if moves and gpus / moves < settings.min_recovered_per_migration:
        many = queue and len(plan.lets_start) > 1
        whose = f"{len(plan.lets_start)} pending jobs" if many else f"pending job {job.job}"
        return (f"plan lets {whose} ({gpus:g} GPUs) start with {moves} migrations "
                f"({gpus / moves:.2f} GPUs per migration < {settings.min_recovered_per_migration:g})")
    return queue_gate(plan, settings) if isinstance(plan, QueuePlan) else None


def queue_gate(plan: QueuePlan, settings: DecisionSettings) -> str | None:
    """None when a queue rule's plan pays for itself: the waiting it ends, less the waiting
    of the jobs it leaves no room for (its displaced jobs), is positive and at least
    ``min_saved_per_work`` times the work its moves cost. A plan that starts a big job by
    taking the room of smaller ones that have waited longer is refused here."""
    net = plan.gpu_hours_waiting_saved - plan.displaced_gpu_hours
    work = plan.work_gpu_hours
    if net > 0 and net >= settings.min_saved_per_work * work:
        return starts_gate(plan) or horizon_gate(plan) or surge_gate(plan)
    displaced = (f", less {plan.displaced_gpu_hours:g} for the {len(plan.displaced)} pending "
                 f"job{'s' if len(plan.displaced) != 1 else ''} it would leave no room for"
                 if plan.displaced else "")
    return (f"plan ends {plan.gpu_hours_waiting_saved:g} GPU-hours of waiting{displaced}: "
            f"{net:.3g} net against {work:.3g} GPU-hours of work its "
            f"{len(plan.migrations)} moves cost (below {settings.min_saved_per_work:g} per GPU-hour)")


def starts_gate(plan: QueuePlan) -> str | None:
    """None when a plan under the ``starts`` rule starts no fewer jobs than waiting would:
    the jobs it lets start, less those it leaves no room for, are at least the small jobs
    expected to start in the room it takes before the next plan (``starts_lost``). A plan
    that starts a big job where several small ones would have started is refused here."""
    if plan.starts_lost is None:
        return None
    gained = len(plan.lets_start) - len(plan.displaced)
    if gained >= plan.starts_lost:
        return None
    return (f"plan starts {gained} more job{'s' if gained != 1 else ''} than waiting would, where "
            f"{plan.starts_lost:.3g} small jobs are expected to start in the room it takes before "
            "the next plan")


def horizon_gate(plan: QueuePlan) -> str | None:
    """None when a plan under the ``horizon`` rule ends more waiting than it causes the small
    jobs: the waiting of the jobs it lets start, less that of those it leaves no room for,
    exceeds the small jobs' waiting while the head holds the room it takes
    (``small_wait_gpu_hours``, over ``horizon_seconds``). A plan that starts a long job in room
    many small jobs would use is refused here."""
    if plan.small_wait_gpu_hours is None:
        return None
    net = plan.gpu_hours_waiting_saved - plan.displaced_gpu_hours
    if net > plan.small_wait_gpu_hours:
        return None
    hours = (plan.horizon_seconds or 0.0) / 3600
    return (f"plan ends {net:.3g} GPU-hours of waiting, where the room it takes for the "
            f"{hours:.3g} h its head is expected to run would cost the small jobs "
            f"{plan.small_wait_gpu_hours:.3g} GPU-hours of waiting")


def surge_gate(plan: QueuePlan) -> str | None:
    """None unless a plan under ``horizon-surge`` or ``horizon-lull`` starts a whole-node job
    into room the small jobs' forecast daily rise needs: the free GPUs it leaves hold less than
    the rise over its head's horizon (``surge_gpus`` above 0, :mod:`exporter.advisor.surge`).
    The head waits for a later evaluation, when the rise has passed or the room is there."""
    if not plan.surge_gpus:
        return None
    hours = (plan.horizon_seconds or 0.0) / 3600
    return (f"plan starts a whole-node job for the {hours:.3g} h its head is expected to run, "
            f"where the small jobs' demand is forecast to rise by {plan.surge_rise_gpus or 0.0:.3g} GPUs: "
            f"the free GPUs it leaves would hold {plan.surge_gpus:.3g} fewer than that")


def describe_start(plan: CompactionPlan) -> str:
    """The plan's gain in the outcome's units: jobs it lets start, waiting it saves."""
    jobs = list(plan.lets_start)
    shown = ", ".join(jobs[:5]) + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else "")
    return (f"lets {len(jobs)} pending job{'s' if len(jobs) != 1 else ''} start ({shown}); "
            f"expected to save {plan.gpu_hours_waiting_saved:g} GPU-hours of waiting")


def describe_gain(plan: CompactionPlan) -> str:
    freed = sorted(plan.nodes_freed.items())
    parts = [f"{n} whole {pool} node{'s' if n != 1 else ''}" for pool, n in freed if n]
    moves = len(plan.migrations)
    what = " and ".join(parts) if parts else "no whole node"
    return (f"plan frees {what} and recovers {plan.fragmented_gpus_recovered:.1f} fragmented GPUs "
            f"with {moves} migration{'s' if moves != 1 else ''}")


@dataclass(frozen=True, slots=True)
class Assessment:
    """An evaluation between its two halves (:meth:`Advisor.assess`, :meth:`Advisor.decide`),
    and what it asks the planner for.

    The scopes are updated, and the plans wanted are named: one for ``pending_job`` (the
    revised rule), one for ``plan_scope`` (the index rule), both or neither (the decision is
    then taken: none, cooldown, or a hold). Each is made on ``measured`` (the snapshot with
    memory needs raised to the measured peaks) at ``now``, and :meth:`Advisor.decide` is
    given them all. The engine never calls the planner itself.
    """

    snapshot: FleetSnapshot  # as observed: the waste lists read it
    measured: FleetSnapshot  # what a plan is made on
    report: Report
    now: float
    trigger: str
    scopes: Mapping[str, ScopeStatus]  # the state this evaluation saw, for the advice
    decision: Decision  # "compact" while a plan is awaited: the gate may still hold it
    scope: str | None
    reasons: tuple[str, ...]  # with a plan awaited, only why the scope is due
    plan_scope: str | None = None
    # the revised rule: the pending job to plan for (its GPUs are idle, in fragments), and the
    # fleet's free GPUs as a key, to remember a miss
    pending_job: JobRequest | None = None
    free_key: int = 0
    # the head when idle GPUs in all would hold it but no repack can make room for it: capacity,
    # said in a note (the test before called it fragments)
    capacity_head: JobRequest | None = None
    # the other partitions' heads a repack could start, in the queue's order: planned for in
    # turn when ``pending_job``'s plan is none or refused (advise)
    other_heads: tuple[JobRequest, ...] = ()



@dataclass(frozen=True, slots=True)
class RepackScope:
    """What :func:`repack_could_fit` weighs for a pending job."""

    free: np.ndarray  # [N] free GPUs per node
    nodes: np.ndarray  # [N] bool: its pool's nodes (every node where the fleet has no such pool)
    big: np.ndarray  # [N] bool: those with GPUs enough for one of its parts
    whole: bool  # it asks whole GPUs
    need: float  # the GPUs it asks in all
    wanted: list[int]  # the models it may use that have such nodes


def repack_scope(state: FleetState, job: JobRequest) -> RepackScope:
    free = state.gpu_free.sum(axis=1)
    nodes = np.ones(len(state.names), dtype=bool)
    if job.pool and job.pool in state.pool_names:
        nodes = state.pool == state.pool_names.index(job.pool)
    parts = max(1, job.node_count)
    big = nodes & (state.gpu_count >= -(-job.gpu_count // parts))
    whole = job.gpu_share >= 1.0 - 1e-9
    need = job.gpu_count if whole else job.gpu_count * job.gpu_share
    wanted = [m for m, name in enumerate(state.model_names)
              if (not job.models or name in job.models) and bool((big & (state.model == m)).any())]
    return RepackScope(free, nodes, big, whole, need, wanted)


def repack_could_fit(snapshot: FleetSnapshot, state: FleetState, job: JobRequest) -> bool:
    """Whether moving jobs could make room for ``job``: fragments, not capacity.

    On some GPU model it may use, within its pool (when the fleet has it), the nodes big
    enough for one of its parts hold free GPU shares, and what moves could take off them:
    no more than their jobs hold, nor than is idle elsewhere in the pool on the models
    those jobs may move to (the planner's :func:`~exporter.advisor.planner.destination_models`,
    by memory; a gang never moves). What it asks must be within that sum (whole GPUs: its
    floor). An upper bound: a repack that could start it is never refused. The sum of all
    idle shares (the test before) said "fragments" for jobs no repack could start: idle
    shares on nodes too small for a part, on models it may not use or its jobs may not
    move to, in other pools, or fractions of GPUs a whole-GPU job cannot use.
    """
    from exporter.advisor.planner import destinations_by_value

    scope = repack_scope(state, job)
    free, nodes, big, whole, need, wanted = (scope.free, scope.nodes, scope.big, scope.whole, scope.need,
                                             scope.wanted)
    if not wanted:
        return False
    # Bounds first: what a model's own big nodes hold free is room whatever its jobs may move
    # to, and all idle GPUs elsewhere in the pool is the most they could move to. Only a model
    # between the two needs the walk over every job below (a thousand on a small fleet, at
    # every evaluation); the answer is the walk's.
    outside: dict[int, float] = {}
    for m in wanted:
        on = big & (state.model == m)
        own = float(free[on].sum())
        if (math.floor(own + 1e-9) if whole else own) >= need - 1e-9:
            return True
        room = own + min(float(state.gpu_count[on].sum()) - own, float(free[nodes & ~on].sum()))
        if (math.floor(room + 1e-9) if whole else room) >= need - 1e-9:
            outside[m] = own
    if not outside:
        return False
    index = {name: i for i, name in enumerate(state.names)}
    model_of, is_big = state.model.tolist(), big.tolist()  # read per job: lists, not numpy scalars
    # per undecided model, what decides where its jobs may move (destination_models reads only
    # these): a fleet's thousand jobs have a few dozen
    asks: dict[int, set[tuple[int | None, tuple[str, ...]]]] = {m: set() for m in outside}
    for alloc in snapshot.allocations:
        if len(alloc.placements) != 1 or (node := index.get(alloc.placements[0].node)) is None:
            continue
        m = model_of[node]
        if m in asks and is_big[node]:
            asks[m].add((alloc.gpu_memory_need_bytes, tuple(alloc.allowed_models)))
    reach: dict[int, set[str]] = {m: set() for m in outside}
    fleet_models = tuple(state.model_names)
    for m, distinct in asks.items():
        for memory, allowed in distinct:
            reach[m].update(destinations_by_value(memory, allowed, state.model_names[m], fleet_models))
    for m, own in outside.items():
        on = big & (state.model == m)
        held = float(state.gpu_count[on].sum()) - own
        to = nodes & ~on & np.isin(np.array(state.model_names)[state.model], sorted(reach[m]))
        room = own + min(held, float(free[to].sum()))
        if whole:
            room = math.floor(room + 1e-9)
        if room >= need - 1e-9:
            return True
    return False

@dataclass
class Advisor:
    """The decision's state over evaluations: dwell, hysteresis, cooldown, holds, idle clocks.

    One evaluation is :meth:`assess`, then the plans it asks for, then :meth:`decide`;
    :func:`exporter.advisor.advise.advise` runs the three. Only the clock tells time, so a
    simulated clock drives it as well as the wall's.
    """

    settings: DecisionSettings = field(default_factory=DecisionSettings)
    clock: Callable[[], float] = time.time
    scopes: dict[str, ScopeState] = field(default_factory=dict)
    last_plan_at: float | None = None  # the cooldown runs from here
    _cooldown_before: float | None = None  # last_plan_at before the latest proposal
    last_hold: tuple[float, str, tuple[str, ...]] | None = None  # when, scope, reasons
    alert_served: dict[str, float] = field(default_factory=dict)  # scope -> when its alert fired
    # job -> since when its GPUs have been below the idle threshold; rebuilt from each
    # snapshot's jobs, so a job that ends (or gets busy) is forgotten at once
    idle_since: dict[str, float] = field(default_factory=dict)
    # job -> peak GPU memory used per GPU (bytes) over its life; rebuilt the same way
    memory_peak: dict[str, float] = field(default_factory=dict)
    advice: Advice | None = None
    plan: CompactionPlan | None = None  # the last plan proposed, as delivered (for /metrics)
    # the plan later advice carries until it expires, and when it was proposed
    carried: CompactionPlan | None = None
    carried_at: float | None = None
    # job -> (free GPUs key, when): no plan let that job start; not asked again while the fleet's
    # free GPUs are the same, for the dwell (the jobs' ages, hence what may move, change slowly)
    pending_misses: dict[str, tuple[int, float]] = field(default_factory=dict)
    _reads: GpuReads | None = field(default=None, repr=False, compare=False)  # gpu_reads, kept
    # the last evaluation's GPUs: their reads outlive the evaluation only while snapshots
    # repeat them (the simulator's do; serve's are new every cycle, and at 100,000 GPUs the
    # reads are tens of MB not worth keeping for nothing)
    _gpus_before: tuple[Gpu, ...] | None = field(default=None, repr=False, compare=False)
    # the last nodes' tuple and its node_generations (a dict of the fleet's nodes at most)
    _generations: tuple[tuple[Node, ...], dict[str, int]] | None = field(
        default=None, repr=False, compare=False)

    def alert_firing(self, alerts: list[dict[str, Any]]) -> list[str]:
        """Alertmanager says these alerts fire: the compaction alert's scopes have served dwell.

        Only scopes the advisor already measures are taken (labels are the sender's
        text, and this state must stay bounded by the fleet); the scopes taken are returned.
        """
        now = self.clock()
        taken = []
        for alert in alerts:
            labels = alert.get("labels") or {}
            name = labels.get("alertname")
            if name not in (self.settings.compaction_alert, self.settings.cluster_alert):
                continue
            if alert.get("status", "firing") != "firing":
                continue
            pool = labels.get("pool")
            scope = (f"pool:{pool}" if name == self.settings.compaction_alert
                     and isinstance(pool, str) and pool else "cluster")
            if scope in self.scopes:
                self.alert_served[scope] = now
                taken.append(scope)
        return taken

    def assess(self, snapshot: FleetSnapshot, report: Report, trigger: str = "snapshot") -> Assessment:
        """The first half of an evaluation: update the per-scope state with this report and
        say whether a plan is wanted (``plan_scope``). Called on every snapshot."""
        now = self.clock()
        s = self.settings
        penalties = inversion_penalties(report)
        for scope, index in scope_indices(report).items():
            state = self.scopes.setdefault(scope, ScopeState())
            state.index = index
            # a tier-inversion penalty is no fragmentation: compaction is judged on the rest, so
            # an alert on an inversion (GpuFleetFragmentationHigh) serves no dwell and starts no plan
            index -= penalties.get(scope, 0.0)
            if index > s.trigger:
                if state.above_since is None:
                    state.above_since = now
                if now - state.above_since >= s.dwell_seconds or scope in self.alert_served:
                    state.recommended = True
            elif index < s.clear_below:
                state.above_since = None
                state.recommended = False
                self.alert_served.pop(scope, None)
        self.memory_peak = memory_peaks(snapshot, self.memory_peak, self._gpu_reads(snapshot))
        measured = with_measured_needs(snapshot, self.memory_peak)
        scopes = {k: ScopeStatus(round(st.index, 2), st.recommended, st.above_since)
                  for k, st in sorted(self.scopes.items())}

        heads, free_key, capacity_head = (self._pending_heads(measured, report, now)
                                          if s.require_pending else ((), 0, None))
        pending_job = heads[0] if heads else None

        def settled(decision: Decision, scope: str | None, reasons: list[str],
                    plan_scope: str | None = None) -> Assessment:
            return Assessment(snapshot, measured, report, now, trigger, scopes, decision, scope,
                              tuple(reasons), plan_scope, pending_job, free_key, capacity_head,
                              heads[1:])

        due = [k for k, st in self.scopes.items() if st.recommended]
        if not due:
            reasons = []
            for scope, st in sorted(self.scopes.items()):
                if st.above_since is not None:
                    reasons.append(f"{_scope_name(scope)} index {st.index:.0f} > {s.trigger:g} for "
                                   f"{_minutes(now - st.above_since)}, dwell is {_minutes(s.dwell_seconds)}")
            for scope, penalty in sorted(penalties.items()):
                index = self.scopes[scope].index
                if index > s.trigger:
                    reasons.append(inversion_remedy(report, scope, index, penalty))
            if not reasons:
                reasons.append(f"cluster index {report.cluster.index:.0f} <= {s.trigger:g}")
            return settled("none", None, reasons)
        # the cluster first, else the pool with the highest index
        scope = "cluster" if "cluster" in due else max(due, key=lambda k: self.scopes[k].index)
        st = self.scopes[scope]
        why_due = (f"{_scope_name(scope)} index {st.index:.0f} > {s.trigger:g} for "
                   f"{_minutes(now - (now if st.above_since is None else st.above_since))}")
        if scope in self.alert_served:
            alert = s.cluster_alert if scope == "cluster" else s.compaction_alert
            why_due += f" (Alertmanager's {alert} fired: its own 'for' served as dwell)"
        if self.last_plan_at is not None and now - self.last_plan_at < s.cooldown_seconds:
            until = self.last_plan_at + s.cooldown_seconds
            return settled("cooldown", scope, [why_due, f"last plan {_minutes(now - self.last_plan_at)} "
                           f"ago; cooldown until {time.strftime('%H:%M:%S', time.gmtime(until))} UTC"])
        if (self.last_hold is not None and trigger == "snapshot" and self.last_hold[1] == scope
                and now - self.last_hold[0] < s.hold_recheck_seconds):
            return settled("hold", scope, [why_due, *self.last_hold[2][1:]])
        if s.require_pending and queue_known(snapshot):
            # the queue is known: moves are planned for the job at its head (_pending_heads) as it
            # waits, never for the index. Index-driven plans that also let some pending job start
            # were tried and cost whole-node jobs 2.9x the waiting of plans for the head alone
            # (docs/simulate.md, "Index plans beside the queue's")
            if not any(j.gpu_count > 0 for j in snapshot.pending):
                return settled("hold", scope, [why_due, "starts no pending job: none is pending "
                                               "(compaction pays only when it lets a waiting job start)"])
            return settled("hold", scope, [why_due, "the index plans nothing while the queue is known: "
                                           "moves are planned for the job at its head, as it waits"])
        return settled("compact", scope, [why_due], plan_scope=scope)

    def _pending_heads(self, snapshot: FleetSnapshot, report: Report, now: float
                       ) -> tuple[tuple[JobRequest, ...], int, JobRequest | None]:
        """The pending jobs to plan for, in turn, and the free GPUs' key. The scheduler keeps a
        head per partition (Slurm's main scheduler skips a partition once its first job cannot
        start, and the others go on), so the heads are the first job asking GPUs of each
        partition (``pool``), in the source's order (the scheduler's queue). Those planned for
        are the heads a repack could make room for (:func:`repack_could_fit`; else only
        capacity lets it start, no move) that no plan was missed for on the same free GPUs
        within the dwell; none while a plan in force already lets one start. Third, the first
        head that waits for capacity though the idle GPUs in all would hold it
        (:attr:`Assessment.capacity_head`). With one partition, the queue's first job."""
        heads: dict[str, JobRequest] = {}
        for request in snapshot.pending:
            if request.gpu_count > 0:
                heads.setdefault(request.pool, request)
        capacity: JobRequest | None = None
        key = hash(report.state.gpu_free.tobytes()) if heads else 0
        misses = self.pending_misses = {
            job: miss for job, miss in self.pending_misses.items()
            if miss[0] == key and now - miss[1] < self.settings.dwell_seconds}
        carried = self.carried
        wanted: list[JobRequest] = []
        for job in heads.values():
            if not repack_could_fit(snapshot, report.state, job):
                if capacity is None and not wanted and (job.gpu_count * job.gpu_share
                                                        <= report.cluster.idle_gpus + 1e-9):
                    capacity = job
                continue
            if carried is not None and carried.expires_at > now and job.job in carried.lets_start:
                return (), 0, None
            if job.job not in misses:
                wanted.append(job)
        return tuple(wanted), key if wanted else 0, None if wanted else capacity

    def decide(self, assessment: Assessment, plan: CompactionPlan | None = None,
               scaling: tuple[PoolAdvice, ...] | None = None,
               pending_plan: CompactionPlan | None = None) -> Advice:
        """The second half, with the plans the assessment asked for in hand: carry the plan
        in force, list the waste, keep the advice.

        ``pending_plan`` is the planner's for ``assessment.pending_job`` (None: none found);
        it is proposed when it moves jobs and passes :func:`pending_gate`, and then ``plan``
        is not looked at. Otherwise ``plan``, the planner's for ``assessment.plan_scope``
        (required when one was asked for), is judged by the gain-per-disruption gate.
        ``scaling`` is added to the advice as it is (the load tracker's, issue 20).
        """
        a, s = assessment, self.settings
        decision, reasons, proposed = a.decision, a.reasons, None
        note: tuple[str, ...] = ()
        if a.pending_job is not None:
            job = a.pending_job
            if (pending_plan is not None and pending_plan.migrations
                    and pending_gate(pending_plan, job, s) is None):
                self.last_hold = None
                self.pending_misses = {}
                self._cooldown_before, self.last_plan_at = self.last_plan_at, a.now
                idle = a.report.cluster.idle_gpus
                decision, reasons = "compact", (
                    f"pending job {job.job} waits for {job.gpu_count * job.gpu_share:g} GPUs while "
                    f"{idle:.0f} are idle, in fragments; {describe_start(pending_plan)}",
                    *pending_plan.reasons)
                proposed = self.plan = self.carried = dataclasses.replace(
                    pending_plan, reasons=reasons)
                self.carried_at = a.now
                in_force, proposed_at, reasons = self._plan_in_force(proposed, reasons, a.now)
                return self._advise(a, "compact", "cluster", reasons, in_force, proposed_at, scaling)
            self.pending_misses[job.job] = (a.free_key, a.now)
            refused = pending_gate(pending_plan, job, s) if pending_plan is not None else None
            note = (refused or f"pending job {job.job} ({job.gpu_count * job.gpu_share:g} GPUs) waits: "
                    "no plan of allowed moves lets it start",)
        elif a.capacity_head is not None:
            job = a.capacity_head
            note = (f"pending job {job.job} ({job.gpu_count * job.gpu_share:g} GPUs) waits for capacity: "
                    f"{a.report.cluster.idle_gpus:.0f} GPUs are idle, but no plan of moves can make room "
                    "for it on the GPU models it may use",)
        if a.plan_scope is not None:
            if plan is None:
                raise ValueError(f"the assessment of {a.plan_scope} needs its plan")
            why_due = a.reasons[0]
            refused = gate(plan, s)
            if not plan.migrations:
                allocated = a.report.cluster.allocated_ratio * 100
                refused = f"index high but nothing worth moving: cluster {allocated:.0f}% allocated"
            elif refused is None and s.require_pending and queue_known(a.snapshot) and not plan.lets_start:
                refused = (f"plan starts no pending job (of {len(a.snapshot.pending)} pending): "
                           "compaction pays only when it lets a waiting job start")
            if refused is not None:
                decision = "hold"
                reasons = (why_due, refused, *(plan.reasons if not plan.migrations else ()))
                self.last_hold = (a.now, a.plan_scope, reasons)
            else:
                self.last_hold = None
                self._cooldown_before, self.last_plan_at = self.last_plan_at, a.now
                short = shortfall(plan, s)
                starting = (describe_start(plan),) if plan.lets_start else ()
                reasons = (f"{why_due}; {describe_gain(plan)}", *starting, *([short] if short else ()),
                           *plan.reasons)
                # the plan as delivered: the advice's reasons are its reasons
                proposed = self.plan = self.carried = dataclasses.replace(plan, reasons=reasons)
                self.carried_at = a.now
        in_force, proposed_at, reasons = self._plan_in_force(proposed, (*reasons, *note), a.now)
        return self._advise(a, decision, a.scope, reasons, in_force, proposed_at, scaling)

    def _advise(self, a: Assessment, decision: Decision, scope: str | None, reasons: tuple[str, ...],
                in_force: CompactionPlan | None, proposed_at: float | None,
                scaling: tuple[PoolAdvice, ...] | None) -> Advice:
        self.advice = Advice(
            evaluated_at=a.now, snapshot_time=a.measured.taken_at, trigger=a.trigger,
            scopes=a.scopes, decision=decision, reasons=reasons, scope=scope,
            plan=in_force, plan_proposed_at=proposed_at,
            reclaim=self._reclaim(a.snapshot, a.now),
            right_sizing=right_sizing(a.snapshot, a.report, self.memory_peak, a.now),
            nvlink_mixed=nvlink_mixed(a.snapshot, self._node_generations(a.snapshot)), scaling=scaling)
        gpus = a.snapshot.gpus
        if gpus is not self._gpus_before:
            self._reads = None
        self._gpus_before = gpus
        return self.advice

    def _plan_in_force(self, proposed: CompactionPlan | None, reasons: tuple[str, ...],
                       now: float) -> tuple[CompactionPlan | None, float | None, tuple[str, ...]]:
        """(plan, proposed at, reasons): a new plan is proposed now; without one, the last plan
        rides along until it expires, with a reason that says it is not new. The same object
        as the one delivered: a receiver that polls sees the same plan_id, which it acts on once."""
        if proposed is not None:
            return proposed, now, reasons
        plan, at = self.carried, self.carried_at
        if plan is None or at is None or plan.expires_at <= now:
            self.carried = self.carried_at = None  # expired: never served again
            return None, None, reasons
        return plan, at, (*reasons,
            f"plan {plan.plan_id} proposed {_minutes(now - at)} ago stays valid until "
            f"{time.strftime('%H:%M:%S', time.gmtime(plan.expires_at))} UTC; this "
            "evaluation proposes no new one")

    def current(self) -> Advice | None:
        """The last advice as ``GET /v1/advice`` serves it: a plan that expired since that
        evaluation is dropped (evaluations follow snapshots, seconds apart or, with a source
        stuck, much longer), so no reader ever gets an expired plan."""
        advice = self.advice
        if advice is None:
            return None
        plan = advice.plan
        if plan is None or plan.expires_at > self.clock():
            return advice
        expired = time.strftime("%H:%M:%S", time.gmtime(plan.expires_at))
        return dataclasses.replace(advice, plan=None, plan_proposed_at=None, reasons=(
            *advice.reasons, f"plan {plan.plan_id} expired at {expired} UTC, after this evaluation"))

    def _reclaim(self, snapshot: FleetSnapshot, now: float) -> tuple[Reclaim, ...]:
        """Jobs whose GPUs stayed below the idle threshold for its duration, costliest first.

        Idleness is counted from the first snapshot that saw it, so an exporter restart
        starts the clock again: the GPU-hours are a lower bound. Never acted on.
        """
        below, duration = self.settings.idle or idle_rule()
        reads = self._gpu_reads(snapshot)
        utilization = reads.utilization
        if not utilization:  # no telemetry: no job is seen idle, and every idle clock stops
            self.idle_since = {}
            return ()
        nodes = snapshot.node_map()
        catalogue = default_catalogue()
        idle: dict[str, float] = {}
        out: list[tuple[int, float, str, Reclaim]] = []
        own = reads.own  # a shared GPU's tenants, each by its own processes
        for alloc in snapshot.allocations:
            used = _job_utilization(alloc, utilization, own)
            if used is None or used >= below:
                continue
            since = idle[alloc.job] = self.idle_since.get(alloc.job, now)
            if now - since < duration:
                continue
            gpus = sum(len(p.gpus) * p.gpu_share for p in alloc.placements)
            node = nodes.get(alloc.placements[0].node)
            model = node.model if node else ""
            spec = catalogue.find(model)
            wasted = round(gpus * (now - since) / 3600, 3)
            rank = (spec.tier or 0) if spec else 0
            out.append((-rank, -wasted, alloc.job, Reclaim(
                job=alloc.job, namespace=alloc.namespace, account=alloc.account,
                pool=node.pool if node else "", model=model, gpus=gpus,
                utilization_ratio=round(used, 4), idle_since=since, gpu_hours_wasted=wasted,
                reason=f"{gpus:g} {model} GPU{'s' if gpus != 1 else ''} under {below:.0%} busy "
                       f"for {_minutes(now - since)} (threshold table {IDLE_ROW}): consider "
                       "reclaiming them; never done automatically",
            )))
        self.idle_since = idle
        return tuple(entry for *_, entry in sorted(out, key=lambda r: r[:3]))

    def _node_generations(self, snapshot: FleetSnapshot) -> dict[str, int]:
        """The snapshot's :func:`node_generations`, kept while the snapshots share their nodes'
        tuple (the simulator's do)."""
        kept = self._generations
        if kept is None or kept[0] is not snapshot.nodes:
            kept = self._generations = (snapshot.nodes, node_generations(snapshot.nodes))
        return kept[1]

    def _gpu_reads(self, snapshot: FleetSnapshot) -> GpuReads:
        """The snapshot's :func:`gpu_reads`, kept while the snapshots share their GPUs' tuple."""
        reads = self._reads
        if reads is None or reads.gpus is not snapshot.gpus:
            reads = self._reads = gpu_reads(snapshot.gpus)
        return reads

    def durable_state(self) -> AdvisorState:
        """What a restart must not lose: the cooldown, the plan in force, the dwell clocks."""
        return AdvisorState(
            self.last_plan_at, self.carried, self.carried_at,
            {k: ScopeStatus(st.index, st.recommended, st.above_since)
             for k, st in sorted(self.scopes.items())})

    def restore(self, state: AdvisorState) -> None:
        """Take back :meth:`durable_state` as an earlier process kept it."""
        self.last_plan_at = state.last_plan_at
        if state.carried is not None and state.carried_at is not None:
            self.plan = self.carried = state.carried
            self.carried_at = state.carried_at
        self.scopes = {k: ScopeState(s.index, s.above_since, s.recommended)
                       for k, s in state.scopes.items()}

    def not_durable(self) -> None:
        """The plan just proposed could not be written to the store: take back its cooldown.

        A cooldown for a plan no receiver can get would lose the plan for its length;
        instead every evaluation may propose again until one is written, and the
        caller starts the cooldown then (:meth:`durable`).
        """
        self.last_plan_at = self._cooldown_before

    def durable(self, at: float) -> None:
        """A proposed plan reached the store at ``at``: the cooldown runs from then."""
        self.last_plan_at = at

    def what_if_scope(self, report: Report) -> str | None:
        """The scope a what-if plans for: above the trigger, the cluster first, else the pool
        with the highest index; None when none is. Dwell and cooldown do not count."""
        above = {k: v for k, v in scope_indices(report).items() if v > self.settings.trigger}
        if not above:
            return None
        return "cluster" if "cluster" in above else max(above, key=above.__getitem__)

    def what_if(self, snapshot: FleetSnapshot, report: Report, now: float,
                plan: CompactionPlan | None) -> WhatIf:
        """Judge ``plan`` (made for :meth:`what_if_scope`, None when that is None) for this
        snapshot alone; changes no state."""
        indices = scope_indices(report)
        scopes = {k: round(v, 2) for k, v in sorted(indices.items())}
        scope = self.what_if_scope(report)
        if scope is None or plan is None:
            return WhatIf(now, snapshot.taken_at, scopes, "none", (
                f"cluster index {report.cluster.index:.0f} <= {self.settings.trigger:g}",))
        refused = gate(plan, self.settings) if plan.migrations else "nothing worth moving"
        reasons = [f"{_scope_name(scope)} index {indices[scope]:.0f} > {self.settings.trigger:g}",
                   describe_gain(plan) if refused is None else refused]
        if refused is None and (short := shortfall(plan, self.settings)):
            reasons.append(short)
        return WhatIf(now, snapshot.taken_at, scopes, "compact" if refused is None else "hold",
                      tuple(reasons), scope, plan if plan.migrations else None)
