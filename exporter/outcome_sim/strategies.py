"""What acts on the running fleet besides the scheduler: the baselines and the advisor.

Every strategy sees the same jobs and the same scheduler, and moves jobs only as
a checkpoint-restart (:meth:`~exporter.outcome_sim.cluster.Cluster.move`), at the
same cost. None of them moves a gang or a high-priority job (the advisor's
``move_high_priority`` default), and by default none moves a job to a GPU model
the advisor's planner would not (:func:`destinations`: a model it may use, with
at least the memory per GPU of the one it runs on), so the comparison is of what
each does with the same freedom. ``consolidate-unrestricted`` and
``descheduler-unrestricted`` are the baselines without that rule (a job may go to
any model it may use, an H200 job to an 80 GB GPU), as they ran before.

- ``none``: nothing moves.
- ``descheduler``: the Kubernetes descheduler's HighNodeUtilization, run every
  ``interval`` (10 min): pods on nodes whose GPUs are under ``threshold``
  allocated (20%, the descheduler's documented example) are evicted, least
  allocated nodes first, at most ``budget`` per run (the advisor's plan budget,
  10); the scheduler re-places each at once with its own policy, off the node it
  left, or it queues again (an eviction without a destination: it waits again,
  and restores its checkpoint when it starts). As in ``bench/advisor.py``.
- ``consolidate``: KAI-Scheduler's consolidation, every ``interval`` (1 min):
  for the job at the head of the queue, when it does not fit, the fewest moves
  (at most ``max_moves``), each to a destination verified free, after which it
  fits; nothing moves when no such set exists.
- ``advisor`` and ``advisor-current``: :mod:`.advisor_loop`.
- ``steer`` and ``steer+advisor``: the scheduler honours the advisor's node weights (:mod:`.steering`).
- ``steer-pod``, ``steer-pod-flat``, ``steer-pod-fresh`` and ``steer-pod+advisor``: it honours
  each job's preferred nodes, the admission webhook's (:mod:`.steering`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from exporter.advisor.planner import destinations_by_value
from exporter.analysis.state import EPS
from exporter.outcome_sim.cluster import Cluster, undo
from exporter.outcome_sim.timeline import Job
from exporter.placement.engine import Placement, Placer, room_after_moves
from exporter.placement.task import Ask, Task

if TYPE_CHECKING:
    from exporter.outcome_sim.sim import Sim

STRATEGIES = ("none", "descheduler", "consolidate", "advisor", "advisor-current", "oracle",
              "oracle-heads", "consolidate-heads", "consolidate-unrestricted", "descheduler-unrestricted",
              "steer", "steer+advisor",
              "steer-pod", "steer-pod-flat", "steer-pod-fresh", "steer-pod+advisor",
              "steer-pod+advisor-freedoms", "steer-pod+lookahead", "steer-pod+lookahead+advisor",
              "steer-pod+reserve")


class Strategy(Protocol):
    name: str
    interval: float

    def tick(self, sim: Sim, now: float) -> None: ...


def movable(job: Job) -> bool:
    """Single-node, spot jobs: the only ones any strategy moves."""
    return job.parts == 1 and not job.high and bool(job.placements)


def any_single_node(job: Job) -> bool:
    """What the oracle may move: any running single-node job, whatever its priority."""
    return job.parts == 1 and bool(job.placements)


# the predicates the cluster's index (:class:`~exporter.outcome_sim.cluster.NodeJobs`) answers:
# whether only spot jobs pass; any other is asked of each indexed job in turn
_INDEXED: dict[Callable[[Job], bool], bool] = {movable: True, any_single_node: False}


def destinations(cluster: Cluster, job: Job) -> tuple[str, ...]:
    """The GPU models the advisor's planner lets ``job`` move to: of those it may use, the one
    it runs on and those with at least its memory per GPU (a job states no memory need here;
    :func:`exporter.advisor.planner.destination_models`, the same function)."""
    placer = cluster.placer
    current = placer.model_names[placer.model[job.placements[0].node]]
    return destinations_by_value(None, job.models, current, placer.model_names)


RULES = ("fair", "unrestricted", "no-slower")  # where moves may send a job: see _models


def _models(cluster: Cluster, job: Job, rule: str) -> tuple[str, ...] | None:
    """Where a strategy may send ``job``: ``fair`` :func:`destinations`; ``no-slower`` those of
    them where it runs at least as fast (the oracle's: a free move costs nothing, not even
    speed); ``unrestricted`` None, its own allowed models."""
    if rule == "unrestricted":
        return None
    placer = cluster.placer
    return _models_by_value(rule, job.models, placer.model_names[placer.model[job.placements[0].node]],
                            job.speed, placer.model_names, cluster.speeds)


@functools.lru_cache(maxsize=4096)
def _models_by_value(rule: str, allowed: tuple[str, ...], current: str, speed: float,
                     model_names: tuple[str, ...], speeds: tuple[float, ...]) -> tuple[str, ...]:
    """:func:`_models` by value, kept: the oracle asks it for each job of each node it tries,
    and a fleet's jobs have a few dozen keys."""
    models = destinations_by_value(None, allowed, current, model_names)
    if rule == "no-slower":
        index = {name: i for i, name in enumerate(model_names)}
        models = tuple(m for m in models if speeds[index[m]] >= speed - 1e-9)
    return models


@dataclass
class Nothing:
    name: str = "none"
    interval: float = math.inf

    def tick(self, sim: Sim, now: float) -> None:
        return None


@dataclass
class Descheduler:
    name: str = "descheduler"
    interval: float = 600.0
    threshold: float = 0.2
    budget: int = 10
    fair: bool = True  # re-placed only where the advisor's planner would move it (:func:`destinations`)

    def tick(self, sim: Sim, now: float) -> None:
        cluster = sim.cluster
        placer = cluster.placer
        counts = placer.gpu_count.astype(float)
        used = np.where(counts > 0, (counts - placer.gpu_free.sum(axis=1)) / np.maximum(counts, 1), 1.0)
        on_node: dict[int, list[Job]] = {}
        for job in cluster.running.values():
            if movable(job) and job.gpus:
                on_node.setdefault(job.placements[0].node, []).append(job)
        under = sorted((n for n in on_node if used[n] < self.threshold), key=lambda n: (used[n], n))
        evicted = 0
        for node in under:
            for job in sorted(on_node[node], key=lambda j: j.id):
                if evicted >= self.budget:
                    return
                evicted += 1
                models = _models(cluster, job, "fair" if self.fair else "unrestricted")
                cluster.interrupt(job, now)
                sim.scheduler.disturbed()
                destination = None if models == () else cluster.find(job, exclude=[node], models=models)
                if destination is None:
                    job.requeued = now  # it waits again, from now
                    sim.requeued.append(job)
                    sim.scheduler.requeue(job)
                else:
                    cluster.start(job, destination, now)


@dataclass
class HeadUnblocker:
    """Moves jobs so the blocked head of the queue can start: the fewest verified moves
    (:func:`unblock`). Tries again for the same head only once capacity has come back.
    ``every_head``: each partition's blocked head in queue order, not only the first: where
    every job is pinned to its model, the first head is often one no repack can start (its
    model is full) while another model's head waits on fragments."""

    max_moves: int = 10  # the advisor's plan budget (advisor.max_migrations)
    candidates: int = 16  # nodes tried per part, the cheapest-looking first
    same_model: bool = False
    fair: bool = True  # each move only where the advisor's planner would move it (:func:`destinations`)
    every_head: bool = False
    # head -> the releases when no way was found for it
    _tried: dict[int, int] = field(default_factory=dict, repr=False)

    def __call__(self, sim: Sim, now: float, may_move: Callable[[Job], bool] = movable) -> bool:
        """Whether it moved jobs."""
        return unblock_a_head(
            sim, self.every_head, self._tried,
            lambda head: unblock(sim, head, self.max_moves, self.candidates, may_move, self.same_model,
                                 "fair" if self.fair else "unrestricted"),
            lambda job, destination: sim.cluster.move(job, destination, now))


def unblock_a_head(sim: Sim, every_head: bool, tried_at: dict[int, int],
                   search: Callable[[Job], list[tuple[Job, list[Placement]]] | None],
                   apply: Callable[[Job, list[Placement]], object]) -> bool:
    """Make the moves ``search`` finds for the first blocked head they let start, and say
    whether it made any. The heads, in queue order: the queue's first only, or each
    partition's (``every_head``); skipped: one that found no way since the last release
    (``tried_at``: head -> releases), one that fits already (the queue's order holds it), one
    with more GPUs than are idle in all. The first-head search remembers only its last
    failed head (as it always did); the every-head one each, until capacity comes back."""
    scheduler, cluster = sim.scheduler, sim.cluster
    heads = scheduler.heads if every_head else ((scheduler.blocked,) if scheduler.blocked else ())
    for head in heads:
        if head.placements or tried_at.get(head.id) == cluster.releases:
            continue
        if cluster.capacity - cluster.busy < head.demand - 1e-9 or _fits_now(cluster, head):
            continue
        found = search(head)
        if found is None:
            if not every_head or any(r != cluster.releases for r in tried_at.values()):
                tried_at.clear()
            tried_at[head.id] = cluster.releases
            continue
        for job, destination in found:
            apply(job, destination)
        scheduler.disturbed()
        sim.plans += 1
        return True
    return False


def _fits_now(cluster: Cluster, head: Job) -> bool:
    """Whether ``head`` fits the fleet as it is (:meth:`Cluster.find`). A gang is counted first:
    where no GPU model has as many nodes with room for a part (:meth:`Placer.room`, which no
    placement goes past) as the gang has parts, it fits nowhere, and the placer is not asked
    to place it part by part only to give each part back (on the GFS fleet, up to 170)."""
    if head.parts > 1 and cluster.policy != "random":  # random draws as it places: asked as before
        placer = cluster.placer
        room = placer.room(cluster.task(head), cluster.policy)
        if np.bincount(placer.model[room], minlength=len(placer.model_names)).max(initial=0) < head.parts:
            return False
    return cluster.find(head) is not None


@dataclass
class Consolidate:
    name: str = "consolidate"
    interval: float = 60.0
    unblocker: HeadUnblocker = field(default_factory=HeadUnblocker)

    def tick(self, sim: Sim, now: float) -> None:
        self.unblocker(sim, now)


def unblock(sim: Sim, head: Job, max_moves: int, candidates: int,
            may_move: Callable[[Job], bool] = movable,
            same_model: bool = False, rule: str = "fair",
            base: Callable[[Job], bool] = movable) -> list[tuple[Job, list[Placement]]] | None:
    """The fewest moves, each to a verified destination, after which ``head`` fits; None if there
    are none within ``max_moves``. The fleet is left as it was. ``may_move`` says which jobs
    may move (always only ``base`` ones: :func:`movable`, but for the oracle); ``same_model``
    keeps each on its GPU model; ``rule`` says which models each may go to (:data:`RULES`).

    Per part of the head (one for a single-node job): of the nodes it may use, those
    whose free GPUs plus their movable jobs' could hold it, fewest movable GPUs
    needed first; on each, its movable jobs leave largest first until the part
    fits, and each must find a destination off that node (placed by the scheduler's
    policy, later moves seeing earlier ones). The node needing the fewest moves wins.
    """
    cluster = sim.cluster
    placer = cluster.placer
    log: list[tuple[str, Placement]] = []  # what was done to the placer, to undo
    moves: list[tuple[Job, list[Placement]]] = []
    taken: list[int] = []

    both = _both(base, may_move)
    if head.parts > 1 and not _nodes_enough(cluster, head, both):
        return None
    try:
        for _ in range(head.parts):
            moved = {job.id for job, _ in moves}
            best = _cheapest_node(sim, head, taken, max_moves - len(moves), candidates, both,
                                  same_model, rule, moved)
            if best is None:
                return None
            node, plan, part = best
            for job, destination in plan:
                for p in job.placements:
                    placer.release(p)
                    log.append(("release", p))
                for p in destination:
                    placer.apply(p)
                    log.append(("apply", p))
            placer.apply(part)
            log.append(("apply", part))
            moves.extend(plan)
            taken.append(node)
        return moves
    finally:
        undo(placer, log)


Moves = list[tuple[Job, list[Placement]]]


def _both(base: Callable[[Job], bool], may_move: Callable[[Job], bool]) -> Callable[[Job], bool]:
    """``base`` and ``may_move`` as one predicate: one the index answers when both are such."""
    if base is may_move:
        return base
    if base in _INDEXED and may_move in _INDEXED:
        return movable if movable in (base, may_move) else any_single_node
    return lambda j: base(j) and may_move(j)


def _model_mask(placer: Placer, models: tuple[str, ...]) -> np.ndarray:
    """Per node, whether its GPU model is one of ``models`` (every node when empty)."""
    if not models:
        return np.ones(len(placer.names), dtype=bool)
    return np.array([m in models for m in placer.model_names], dtype=bool)[placer.model]


def _nodes_enough(cluster: Cluster, head: Job, may_move: Callable[[Job], bool]) -> bool:
    """False only where :func:`unblock` surely finds no way for the gang ``head``: no GPU model
    has as many nodes where a part could fit once the jobs ``may_move`` lets move left (the
    test :func:`_cheapest_node` makes of each node, with a margin for rounding) as it has
    parts. A plan's moves only take such nodes away: a job leaving a node takes its GPUs out
    of the node's movable ones, and one arriving takes free GPUs; each part takes a node."""
    placer = cluster.placer
    movable_share, count, _ = _movable_by_node(cluster, may_move)
    ok = _part_nodes(placer, _model_mask(placer, head.models), head, placer.gpu_free.sum(axis=1),
                     movable_share, count, margin=1e-6)
    return bool(np.bincount(placer.model[ok], minlength=len(placer.model_names)).max(initial=0) >= head.parts)


def _part_nodes(placer: Placer, model_ok: np.ndarray, head: Job, free: np.ndarray,
                movable_share: np.ndarray, count: np.ndarray, margin: float) -> np.ndarray:
    """Per node, whether a part of ``head`` could fit there once its movable jobs left: a model
    ``model_ok`` allows, GPUs enough, free plus movable GPUs enough (less ``margin``), and a
    job to move."""
    need = head.gpus * head.share
    return model_ok & (placer.gpu_count >= head.gpus) & (free + movable_share >= need - margin) & (count > 0)


def _movable_by_node(cluster: Cluster, may_move: Callable[[Job], bool], moved: Set[int] = frozenset()
                     ) -> tuple[np.ndarray, np.ndarray, Callable[[int], list[Job]]]:
    """Of the running jobs ``may_move`` lets move, less those in ``moved``: per node, their GPUs
    summed and their number, and a node's list (largest first): what a scan of every running
    job would gather, read from the cluster's index by node."""
    index = cluster.single
    spot_only = _INDEXED.get(may_move)

    def passes(job: Job) -> bool:
        if spot_only is None:
            return may_move(job) and job.id not in moved
        return not (spot_only and job.high) and job.id not in moved

    if spot_only is None:  # any predicate: asked of every single-node job, the only kind any moves
        share = np.zeros(index.size)
        count = np.zeros(index.size, dtype=np.int64)
        for node, jobs in index.jobs.items():
            for job in jobs.values():
                if passes(job):
                    share[node] += job.demand
                    count[node] += 1
    else:
        share = index.spot_demand if spot_only else index.demand
        count = index.spot_count if spot_only else index.count
        touched = {cluster.running[i].placements[0].node for i in moved if i in cluster.running}
        if touched:  # the nodes a plan's earlier moves leave: summed again without those jobs
            share, count = share.copy(), count.copy()
            for node in touched:
                share[node], count[node] = 0.0, 0
                for job in index.on(node):
                    if passes(job):
                        share[node] += job.demand
                        count[node] += 1

    def on_node(node: int) -> list[Job]:
        """The node's jobs that may move, largest first (the order a node is emptied in); the
        index's own list where every job passes (not to be changed)."""
        if spot_only is False and not moved:
            return index.largest_first(node)
        return [job for job in index.largest_first(node) if passes(job)]

    return share, count, on_node


def _cheapest_node(sim: Sim, head: Job, taken: list[int], budget: int, candidates: int,
                   may_move: Callable[[Job], bool], same_model: bool,
                   rule: str = "fair", moved: Set[int] = frozenset()) -> tuple[int, Moves, Placement] | None:
    """The node where ``head``'s next part fits after the fewest moves of the jobs ``may_move``
    lets move (less ``moved``, the plan's so far), with those moves; None if none does."""
    cluster = sim.cluster
    placer = cluster.placer
    model_ok = _model_mask(placer, head.models)
    if taken and head.parts > 1:  # a gang's parts share a model
        model_ok &= placer.model == placer.model[taken[0]]
    movable_share, count, on_node = _movable_by_node(cluster, may_move, moved)
    free = placer.gpu_free.sum(axis=1)
    need = head.gpus * head.share
    ok = _part_nodes(placer, model_ok, head, free, movable_share, count, margin=1e-9)
    ok[taken] = False
    eligible = np.flatnonzero(ok)
    # fewest movable GPUs needed first, then by node: the order of (max(0, need - free), node)
    nodes = eligible[np.lexsort((eligible, np.maximum(0.0, need - free[eligible])))][:candidates].tolist()
    best: tuple[int, Moves, Placement] | None = None
    part_task = cluster.task(head)
    room = _Room(cluster, rule)
    part_ask = Ask.of(part_task)
    for node in nodes[:candidates]:
        limit = budget if best is None else len(best[1]) - 1
        if limit <= 0:
            break
        leaving = jobs = on_node(node)  # largest first: the order _evacuate_for takes
        # the largest first, so these are heapq.nlargest's: the same sum
        if not room_after_moves(free[node], [j.demand for j in leaving[:limit]], limit, part_task):
            continue  # _evacuate_for would end with None, as in the advisor's planner
        if _stuck(cluster, node, leaving, limit, part_ask, same_model, room):
            continue  # the same, told without placing anything
        found = _evacuate_for(sim, node, jobs, limit, part_task, same_model, rule)
        if found is not None and (best is None or len(found[0]) < len(best[1])):
            best = (node, found[0], found[1])
    return best


@dataclass
class _Room:
    """For the nodes tried for one head: where each leaving job's task could go in the fleet as
    it is (:meth:`Placer.room`) and what is free there, kept while the placer does not change;
    and each job's models and task (the same at every node tried: the jobs are where they were)."""

    cluster: Cluster
    rule: str
    _kept: dict[Task, np.ndarray] = field(default_factory=dict)
    _at: int = -1
    _models: dict[int, tuple[str, ...] | None] = field(default_factory=dict)
    _tasks: dict[tuple[int, tuple[str, ...] | None], Task] = field(default_factory=dict)
    free: np.ndarray = field(default_factory=lambda: np.zeros(0))  # free GPU shares per node, summed
    whole: np.ndarray = field(default_factory=lambda: np.zeros(0))  # whole free GPUs per node
    cpu: np.ndarray = field(default_factory=lambda: np.zeros(0))  # free cores per node

    def models(self, job: Job) -> tuple[str, ...] | None:
        if job.id not in self._models:
            self._models[job.id] = _models(self.cluster, job, self.rule)
        return self._models[job.id]

    def where(self, job: Job, models: tuple[str, ...] | None) -> np.ndarray:
        """The nodes where ``job``'s task on ``models`` fits now (a bool per node)."""
        placer = self.cluster.placer
        if self._at != placer.changes:
            self._kept.clear()
            self._at = placer.changes
            self.free = placer.gpu_free.sum(axis=1)
            self.whole = np.count_nonzero(placer.gpu_free >= 1.0 - EPS, axis=1)
            self.cpu = placer.cpu_free.copy()
        task = self._tasks.get((job.id, models))
        if task is None:
            task = self._tasks[(job.id, models)] = self.cluster.task(job, models)
        fits = self._kept.get(task)
        if fits is None:
            fits = self._kept[task] = placer.room(task, self.cluster.policy)
        return fits


def _stuck(cluster: Cluster, node: int, leaving: list[Job], limit: int, ask: Ask, same_model: bool,
           room: _Room) -> bool:
    """True only where :func:`_evacuate_for` surely answers None, told on a copy of ``node``'s
    row, placing nothing: taking its jobs off largest first (``leaving``, in that order), the
    head's part (``ask``) does not fit before ``limit`` of them have left; or one that must
    leave may go to no model, or fits on no other node even now (a trial only takes room
    elsewhere); or those that must leave together ask more than is free on the other nodes
    where any of them fits (GPU shares, whole GPUs, cores; each placement may take up to EPS
    more than is free). False: the trial decides."""
    placer = cluster.placer
    row = placer.gpu_free[node].copy()
    cpu = float(placer.cpu_free[node])
    cpu_total = float(placer.cpu_total[node])
    need = 1.0 - EPS if ask.kind == "whole" else ask.share - EPS
    anywhere = whole_anywhere = None  # the other nodes where any of the leaving (whole-GPU) jobs fits
    demand = cores = 0.0
    gpus = whole_gpus = 0

    def fits_here() -> bool:  # place_on's first test (evaluate's); True: the part may fit
        return cpu >= ask.cpus - EPS and (ask.kind == "cpu" or int(np.count_nonzero(row >= need)) >= ask.gpus)

    for i, job in enumerate(leaving):
        if fits_here():
            return False
        if i >= limit:
            return True
        models = room.models(job)
        if same_model:
            own = placer.model_names[placer.model[node]]
            models = (own,) if models is None or own in models else ()
        if models == ():
            return True
        fits = room.where(job, models)
        if int(np.count_nonzero(fits)) <= int(fits[node]):
            return True
        anywhere = fits.copy() if anywhere is None else anywhere | fits
        anywhere[node] = False
        demand += job.demand
        cores += job.cpus
        gpus += job.gpus
        if job.gpus and job.share >= 1.0 - EPS:
            whole_anywhere = fits.copy() if whole_anywhere is None else whole_anywhere | fits
            whole_anywhere[node] = False
            whole_gpus += job.gpus
            if whole_gpus > int(room.whole[whole_anywhere].sum()):
                return True
        if (demand > float(room.free[anywhere].sum()) + gpus * EPS + 1e-9
                or cores > float(room.cpu[anywhere].sum()) + (i + 1) * EPS + 1e-9):
            return True
        for p in job.placements:  # as Placer.release does it, to the bit
            slots = list(p.slots)
            row[slots] = np.minimum(row[slots] + p.gpu_share, 1.0)
            cpu = min(cpu_total, cpu + p.cpus)
    return not fits_here()


def _evacuate_for(sim: Sim, node: int, jobs: list[Job], limit: int, task: Task, same_model: bool,
                  rule: str = "fair") -> tuple[list[tuple[Job, list[Placement]]], Placement] | None:
    """Move ``node``'s jobs off it, largest first, until the head's part (``task``) fits there;
    undone after."""
    cluster = sim.cluster
    placer = cluster.placer
    log: list[tuple[str, Placement]] = []
    plan: list[tuple[Job, list[Placement]]] = []
    try:
        for job in sorted(jobs, key=lambda j: (-j.demand, j.id)):
            part = placer.place_on(task, node, cluster.policy)  # the part must land on ``node``
            if part is not None:
                return plan, part
            if len(plan) >= limit:
                return None
            models = _models(cluster, job, rule)
            if same_model:
                own = placer.model_names[placer.model[node]]
                models = (own,) if models is None or own in models else ()
            if models == ():
                return None  # it may go nowhere else
            for p in job.placements:
                placer.release(p)
                log.append(("release", p))
            destination = placer.place(cluster.task(job, models), cluster.policy, exclude=[node])
            if destination is None:
                return None
            placer.apply(destination)
            log.append(("apply", destination))
            plan.append((job, [destination]))
        part = placer.place_on(task, node, cluster.policy)
        return (plan, part) if part is not None else None
    finally:
        undo(placer, log)


__all__ = ["RULES", "STRATEGIES", "Consolidate", "Descheduler", "HeadUnblocker", "Nothing", "Strategy",
           "any_single_node", "destinations", "movable", "unblock", "unblock_a_head"]
