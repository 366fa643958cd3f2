"""The running fleet: the placement engine's working copy and the jobs on it.

Jobs are placed with :class:`~exporter.placement.engine.Placer`, the engine
``gpufleet replay`` and the advisor's planner use. A gang (several parts) is
placed part by part on the same GPU model (one NVLink domain; generations do not
interconnect) and on distinct nodes; if any part finds no room, every part
placed so far is given back: a gang starts whole or not at all.

Moves and evictions cost what the job computed since its last checkpoint, and its
next start a restore time, in GPU-seconds (its GPUs x those seconds); the job
redoes the lost work after the restore, so it also finishes later. A job evicted
back into the queue restores when it starts again, and is charged the restore
then, not at the eviction: one that never starts again performed none.

A job's work runs at its GPU model's throughput (the catalogue's, the H100 1.0):
moved to a slower model, it finishes later.

The running single-node jobs are also kept by node (:class:`NodeJobs`), with their
GPUs summed per node, so the strategies that look for jobs to move read them there
instead of scanning every running job for every head.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.fgd import CompiledWorkload
from exporter.analysis.state import FleetState
from exporter.gpu_catalogue import default_catalogue, speed
from exporter.outcome_sim.free_counts import FreeCounts
from exporter.outcome_sim.timeline import Job
from exporter.placement.engine import Placement, Placer
from exporter.placement.task import Task

FGD_POLICIES = ("fgd", "tiered", "lookahead")


@dataclass(frozen=True, slots=True)
class MoveCost:
    checkpoint: float = 900.0  # seconds between a job's checkpoints (the reference cluster: 15 min)
    restore: float = 120.0  # seconds to restore a checkpoint on the new GPUs


@dataclass
class NodeJobs:
    """The running single-node jobs by node, each node's in the order :attr:`Cluster.running`
    lists them, so a sum over a node's jobs adds them as a scan of ``running`` would, to the
    last bit; and per node their GPUs summed and their number, of all of them and of the spot
    ones (what the baselines may move), kept as each node changes."""

    size: int
    jobs: dict[int, dict[int, Job]] = field(default_factory=dict)  # node -> {job id: job}
    order: dict[int, int] = field(default_factory=dict)  # job id -> when it entered ``running``
    started: int = 0

    def __post_init__(self) -> None:
        self.demand = np.zeros(self.size)  # GPUs held by single-node jobs, per node
        self.count = np.zeros(self.size, dtype=np.int64)
        self.spot_demand = np.zeros(self.size)  # the same, of spot jobs only
        self.spot_count = np.zeros(self.size, dtype=np.int64)
        self._largest: dict[int, list[Job]] = {}  # node -> largest_first's list

    def add(self, job: Job) -> None:
        self.started += 1
        self.order[job.id] = self.started
        self.jobs.setdefault(job.placements[0].node, {})[job.id] = job
        self._sum(job.placements[0].node)

    def remove(self, job: Job, node: int) -> None:
        del self.order[job.id]
        on = self.jobs[node]
        del on[job.id]
        if not on:
            del self.jobs[node]
        self._sum(node)

    def moved(self, job: Job, old: int) -> None:
        """``job`` went from node ``old`` to its placement's without leaving ``running``: it
        keeps its place in the order, so the new node's jobs are put back in order."""
        on = self.jobs[old]
        del on[job.id]
        if not on:
            del self.jobs[old]
        self._sum(old)
        new = job.placements[0].node
        there = self.jobs.setdefault(new, {})
        there[job.id] = job
        if len(there) > 1:
            self.jobs[new] = dict(sorted(there.items(), key=lambda kv: self.order[kv[0]]))
        self._sum(new)

    def _sum(self, node: int) -> None:
        total = spot = 0.0
        count = spot_count = 0
        for job in self.jobs.get(node, {}).values():
            total += job.demand
            count += 1
            if not job.high:
                spot += job.demand
                spot_count += 1
        self.demand[node], self.count[node] = total, count
        self.spot_demand[node], self.spot_count[node] = spot, spot_count
        self._largest.pop(node, None)

    def on(self, node: int) -> Iterable[Job]:
        return self.jobs.get(node, {}).values()

    def largest_first(self, node: int) -> list[Job]:
        """The node's jobs, the most GPUs first, then by id: the order a node is emptied in
        (kept until the node's jobs change)."""
        found = self._largest.get(node)
        if found is None:
            found = self._largest[node] = sorted(self.on(node), key=lambda j: (-j.demand, j.id))
        return found


@dataclass
class Cluster:
    state: FleetState
    policy: str = "bestfit"
    workload: CompiledWorkload | None = None
    cost: MoveCost = field(default_factory=MoveCost)
    running: dict[int, Job] = field(default_factory=dict)
    finishes: list[tuple[float, int, int]] = field(default_factory=list)  # (end, job id, version)
    busy: float = 0.0  # GPUs held now, shares summed
    releases: int = 0  # bumped whenever capacity comes back: what failed before may fit now
    migrations: int = 0
    lost_gpu_seconds: float = 0.0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __post_init__(self) -> None:
        # the engine keeps F(M) current only when a policy needs it (fgd): it costs every change
        self.placer = Placer(self.state, self.workload if self.policy in FGD_POLICIES else None)
        # per node, its GPUs with a share free: the scheduler's and the wait split's, one copy
        self.free = FreeCounts(self.placer)
        self.capacity = float(self.state.gpu_count.sum())
        catalogue = default_catalogue()
        self.speeds = tuple(speed(catalogue.get(name)) for name in self.placer.model_names)
        self.single = NodeJobs(len(self.placer.names))
        # every running job (gangs too) by the nodes its parts are on, and its place in
        # ``running``'s order: the scheduler's reservation reads the jobs of the nodes it waits
        # for there, in the order a scan of ``running`` meets them, instead of scanning them all
        self.parts_on: dict[int, dict[int, Job]] = {}
        self.entered: dict[int, int] = {}
        self._entries = 0
        # each reader's set of the ids of jobs started, stopped or relocated since it last
        # looked: the advisor's snapshot follows the fleet by them, not by a pass over it
        self.watchers: list[set[int]] = []

    # -- placing ----------------------------------------------------------------

    def task(self, job: Job, models: tuple[str, ...] | None = None) -> Task:
        return Task(job.cpus, job.gpus, job.share if job.gpus else 1.0,
                    job.models if models is None else models)

    def find(self, job: Job, exclude: Sequence[int] = (), policy: str | None = None,
             models: tuple[str, ...] | None = None) -> list[Placement] | None:
        """Where ``job`` would go now, every part, or None; the placer is left as it was.
        ``models``: the GPU models it may go to (None: its own allowed ones)."""
        if not self.could_fit(job, exclude):
            return None
        placed = self._place_all(job, exclude, policy or self.policy, models)
        if placed is not None:
            for p in placed:
                self.placer.release(p)
        return placed

    def could_fit(self, job: Job, exclude: Sequence[int] = ()) -> bool:
        """A necessary condition, checked on the arrays in one go: enough nodes with room for a
        part, whatever their model. Most tries in a busy fleet fail, and fail here, cheaply."""
        placer = self.placer
        room = placer.cpu_free >= job.cpus - 1e-9
        if job.gpus:
            need = 1.0 if job.share >= 1.0 - 1e-9 else job.share
            room &= (placer.gpu_free >= need - 1e-9).sum(axis=1) >= job.gpus
        if len(exclude):
            room[list(exclude)] = False
        return int(room.sum()) >= job.parts

    def _place_all(self, job: Job, exclude: Sequence[int], policy: str,
                   models: tuple[str, ...] | None = None) -> list[Placement] | None:
        placer = self.placer
        if models is None:
            models = job.models
        allowed = list(models) if models else list(placer.model_names)
        rng = self.rng if policy == "random" else None
        while allowed:
            first = placer.place(self.task(job, tuple(allowed)), policy, rng, exclude=exclude)
            if first is None:
                return None
            placer.apply(first)
            parts = [first]
            if job.parts == 1:
                return parts
            model = placer.model_names[placer.model[first.node]]
            rest = self.task(job, (model,))
            while len(parts) < job.parts:
                found = placer.place(rest, policy, rng, exclude=[*exclude, *(p.node for p in parts)])
                if found is None:
                    break
                placer.apply(found)
                parts.append(found)
            if len(parts) == job.parts:
                return parts
            for p in parts:  # a gang starts whole or not at all
                placer.release(p)
            allowed.remove(model)
        return None

    def fits_empty(self, job: Job) -> bool:
        """Whether the job could ever start: it fits the empty fleet."""
        empty = Cluster(self.state, "bestfit")
        return empty.find(job) is not None

    # -- running ----------------------------------------------------------------

    def speed_on(self, placements: list[Placement]) -> float:
        """The throughput of the GPU model ``placements`` are on (a gang's parts share one)."""
        return self.speeds[int(self.placer.model[placements[0].node])] if placements else 1.0

    def start(self, job: Job, placements: list[Placement], now: float) -> None:
        """Hold ``placements`` for ``job``; it computes from ``now``, or after restoring its
        checkpoint when it was stopped (a move, an eviction): that restore is charged here."""
        for p in placements:
            self.placer.apply(p)
        job.placements = placements
        if job.start is None:
            job.start = now
        if job.requeued is not None:
            job.rewaited += now - job.requeued
            job.requeued = None
        restore = 0.0
        if job.restore_due:
            restore = self.cost.restore
            job.restore_due = False
            lost = restore * job.demand  # its GPUs are held while it restores
            job.lost_gpu_seconds += lost
            self.lost_gpu_seconds += lost
        job.speed = self.speed_on(placements)
        job.resumed = now + restore
        job.placed = now
        job.version += 1
        self.running[job.id] = job
        self._entries += 1
        self.entered[job.id] = self._entries
        self._on_nodes(job)
        if job.parts == 1:
            self.single.add(job)
        self.busy += job.demand
        heapq.heappush(self.finishes, (job.end(), job.id, job.version))
        for seen in self.watchers:
            seen.add(job.id)

    def stop(self, job: Job) -> None:
        """Give the job's GPUs back (it finished, or moves, or is evicted)."""
        for p in job.placements:
            self.placer.release(p)
        if job.parts == 1:
            self.single.remove(job, job.placements[0].node)
        self._off_nodes(job)
        del self.entered[job.id]
        job.placements = []
        job.version += 1
        del self.running[job.id]
        self.busy -= job.demand
        self.releases += 1
        for seen in self.watchers:
            seen.add(job.id)

    def interrupt(self, job: Job, now: float) -> float:
        """Stop the job for a move or an eviction: keep what its checkpoints saved, count the rest
        as lost; its next start restores the checkpoint. Returns the GPU-seconds lost."""
        saved, since = job.progress(now, self.cost.checkpoint)
        job.done = min(job.work, job.done + saved * job.speed)
        job.restore_due = True
        lost = since * job.demand
        job.lost_gpu_seconds += lost
        job.migrations += 1
        self.lost_gpu_seconds += lost
        self.migrations += 1
        self.stop(job)
        return lost

    def move(self, job: Job, destination: list[Placement], now: float) -> None:
        """Checkpoint-restart ``job`` on ``destination`` (verified free by the caller)."""
        self.interrupt(job, now)
        self.start(job, destination, now)

    def relocate(self, job: Job, destination: list[Placement], now: float) -> None:
        """A free, instant move (the oracle's): the job keeps all it computed, restores nothing,
        and runs on at the speed of its new GPU model. ``destination`` verified free by the caller."""
        if now > job.resumed:  # still restoring: it has computed nothing since
            job.done = min(job.work, job.done + (now - job.resumed) * job.speed)
            job.resumed = now
        for p in job.placements:
            self.placer.release(p)
        for p in destination:
            self.placer.apply(p)
        old = job.placements[0].node
        self._off_nodes(job)
        job.placements = destination
        self._on_nodes(job)
        if job.parts == 1:
            self.single.moved(job, old)
        job.speed = self.speed_on(destination)
        job.placed = now
        job.version += 1
        job.migrations += 1
        self.migrations += 1
        self.releases += 1  # room moved: what failed to fit before may fit now
        heapq.heappush(self.finishes, (job.end(), job.id, job.version))
        for seen in self.watchers:
            seen.add(job.id)

    def _on_nodes(self, job: Job) -> None:
        for p in job.placements:
            self.parts_on.setdefault(p.node, {})[job.id] = job

    def _off_nodes(self, job: Job) -> None:
        for p in job.placements:
            on = self.parts_on[p.node]
            on.pop(job.id, None)  # a second part on the same node was taken off with the first
            if not on:
                del self.parts_on[p.node]

    def due(self, until: float) -> list[Job]:
        """Jobs whose run ends by ``until``, earliest first, skipping stale entries."""
        out = []
        while self.finishes and self.finishes[0][0] <= until:
            _, job_id, version = heapq.heappop(self.finishes)
            job = self.running.get(job_id)
            if job is not None and job.version == version:
                out.append(job)
        return out

    def free_placement(self, placement: Placement) -> bool:
        """Whether ``placement`` fits the fleet now (a plan's destination, checked before acting)."""
        row = self.placer.gpu_free[placement.node]
        slots = list(placement.slots)
        return bool((row[slots] >= placement.gpu_share - 1e-9).all()
                    and self.placer.cpu_free[placement.node] >= placement.cpus - 1e-9)


def undo(placer: Placer, log: list[tuple[str, Placement]]) -> None:
    """Take back what a trial did to ``placer``: ``log`` lists ("apply" | "release", placement)
    in the order done; they are reversed, last first, and the log emptied."""
    for op, p in reversed(log):
        if op == "apply":
            placer.release(p)
        else:
            placer.apply(p)
    log.clear()


__all__ = ["FGD_POLICIES", "Cluster", "MoveCost", "NodeJobs", "undo"]
