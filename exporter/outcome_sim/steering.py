"""Steering in the loop: a scheduler that honours the advisor's per-node preferences.

Every ``every`` seconds (serve's :data:`~exporter.advisor.advise.STEER_EVERY`, 300 s:
serve computes the weights at most that often) the strategy computes each node's
Slurm weight from the live placement state and the run's target workload
(:func:`exporter.advisor.steer.expected_growth`, then
:func:`~exporter.advisor.steer.weights`), and hands them to the scheduler's placer
as its per-node rank (:attr:`exporter.placement.engine.Placer.preference`). The
scheduler then places as Slurm with node weights: among the nodes where a job fits,
the lowest weight, and within a weight its own policy's best (``bestfit`` by
default). Nodes without GPUs keep Slurm's default weight, as serve leaves them.
Between two computations the weights stand, as an operator's ``scontrol`` updates
would; the first are computed at the first tick, before it the scheduler places by
its policy alone.

- ``steer``: the weights alone; nothing moves.
- ``steer+advisor``: the weights, and the advisor's compaction
  (:class:`~exporter.outcome_sim.advisor_loop.AdvisorStrategy`, the revised rule) at
  its own cadence.

The per-pod form, the admission webhook's (:mod:`exporter.advisor.admission`), as
:class:`SteerPod`:

- ``steer-pod``: each job, as it is submitted, gets the preferred node affinity the
  webhook adds to its pod (:func:`exporter.advisor.steer.preferred_nodes`, fgd's order
  for *its* ask on its models): a term naming fgd's own choice and a term naming the
  :data:`~exporter.advisor.steer.PREFERRED_NODES` best, so fgd's choice scores both.
  They are computed from the fleet as serve's last cycle saw it: the placement state
  every ``cycle`` seconds, serve's ``collect_interval`` (5 s by default; the webhook
  answers from the last frame). A pod's affinity is fixed at its creation, so a job
  that waits keeps the nodes named at its submission; a job started and later put
  back in the queue (an eviction, a preemption: a new pod in Kubernetes) is named
  nodes again. Jobs submitted before the first cycle get none (the webhook admits a
  pod unchanged while serve has no frame). The scheduler places as kube-scheduler
  with those terms: among the nodes where the job fits, fgd's choice first, then the
  other named nodes, then the rest, each by its own policy (``bestfit`` by default).
  A lexicographic order, as the NodeAffinity score (2 x 100 for both terms, 2 x 50 for
  one, with the default plugin weights) outweighs the resource-fit score's 0-100; in
  a real scheduler other scores (taints, spreading) may still reorder them.
- ``steer-pod-flat``: the webhook's form before: one term, every named node alike (the
  nodes of least growth, :func:`~exporter.advisor.steer.preferred_order`), so the
  scheduler's own policy picks among them.
- ``steer-pod-fresh``: ``steer-pod``'s terms named again at every scheduling attempt
  from the last cycle's state, not once at submission: what a scheduler extender
  asked at scheduling time would give (gpufleet ships none), and the bound on what
  freshness is worth.
- ``steer-pod+advisor``: ``steer-pod``, and the advisor's compaction at its cadence.
- ``steer-pod+advisor-freedoms``: the same, the advisor's planner granted the freedoms an
  operator may give it and the defaults withhold
  (:data:`~exporter.outcome_sim.advisor_loop.FREEDOMS`: high-priority and young jobs movable,
  64 moves a plan): every lever on but the look-ahead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from exporter.advisor.advise import STEER_EVERY
from exporter.advisor.steer import (
    PREFERRED_NODES,
    WEIGHT_BEST,
    expected_growth,
    fgd_order,
    node_view,
    preferred_order,
    weights,
)
from exporter.outcome_sim.advisor_loop import AdvisorStrategy

if TYPE_CHECKING:
    from exporter.analysis.state import FleetState
    from exporter.outcome_sim.sim import Sim
    from exporter.outcome_sim.timeline import Job
    from exporter.placement import policies

STEER_STRATEGIES = ("steer", "steer+advisor")
POD_STRATEGIES = ("steer-pod", "steer-pod-flat", "steer-pod-fresh", "steer-pod+advisor",
                  "steer-pod+advisor-freedoms")
CYCLE = 5.0  # seconds between two of serve's cycles (collect_interval's default)


@dataclass
class Steer:
    name: str = "steer"
    every: float = STEER_EVERY  # seconds between two computations of the weights
    advisor: AdvisorStrategy | None = None  # compaction too (steer+advisor)
    computations: int = 0
    interval: float = field(init=False)
    _next: float = 0.0

    def __post_init__(self) -> None:
        self.interval = self.every if self.advisor is None else min(self.every, self.advisor.interval)

    def tick(self, sim: Sim, now: float) -> None:
        if now >= self._next:
            self._next = now + self.every
            self.computations += 1
            placer = sim.cluster.placer
            levels = weights(expected_growth(placer.state, sim.workload))
            # serve steers only nodes with GPUs (advise.steering_of): the others keep Slurm's
            # default weight, or CPU-only jobs would be sent to the GPU nodes first
            levels[placer.gpu_count == 0] = WEIGHT_BEST
            placer.preference = levels
        if self.advisor is not None:
            self.advisor.tick(sim, now)


@dataclass
class SteerPod:
    """The admission webhook's preferred nodes, per job at its submission (module docstring)."""

    name: str = "steer-pod"
    cycle: float = CYCLE  # seconds between two states the webhook answers from
    advisor: AdvisorStrategy | None = None  # compaction too (steer-pod+advisor)
    limit: int = PREFERRED_NODES
    flat: bool = False  # one term, every named node alike (steer-pod-flat)
    # named again at each scheduling attempt, from the last cycle's state (steer-pod-fresh)
    fresh: bool = False
    cycles: int = 0
    named: int = 0  # times a job was named preferred nodes
    computed: int = 0  # (state, shape) pairs scored
    interval: float = field(init=False)
    _next: float = 0.0
    _advisor_next: float = 0.0  # the advisor is looked at on its own cadence, not each cycle
    _state: FleetState | None = None  # the fleet at the last cycle: what the webhook answers from
    _view: policies.NodeView | None = None
    _sim: Sim | None = None
    _by_shape: dict[tuple, np.ndarray] = field(default_factory=dict)  # this cycle's ranks per shape
    _named: dict[int, np.ndarray | None] = field(default_factory=dict)  # job id -> its rank

    def __post_init__(self) -> None:
        self.interval = self.cycle if self.advisor is None else min(self.cycle, self.advisor.interval)

    def tick(self, sim: Sim, now: float) -> None:
        if now >= self._next:
            self._next = now + self.cycle
            self.cycles += 1
            if self._sim is None:
                self._sim = sim
                sim.scheduler.steer = self.rank
            if not self.fresh:
                # a pod keeps what it was named at its creation: the jobs queued since the last
                # cycle that no pass tried yet are named from the state they were submitted
                # under; a job that started is forgotten (put back in the queue, it is a new pod)
                queued = sim.scheduler.queue.jobs()
                for job in queued:
                    if job.id not in self._named:
                        self._named[job.id] = self._rank_of(job)
                waiting = {job.id for job in queued}
                self._named = {k: v for k, v in self._named.items() if k in waiting}
            self._state = sim.cluster.placer.state
            self._view = None
            self._by_shape.clear()
        if self.advisor is not None and now >= self._advisor_next:
            self._advisor_next = now + self.advisor.interval
            self.advisor.tick(sim, now)

    def rank(self, job: Job) -> np.ndarray | None:
        """The scheduler's per-node rank for ``job``, the lowest first where it fits: 0 on fgd's
        choice, 1 on the other named nodes (``flat``: 0 on every named node), 2 elsewhere;
        None (its policy alone) when it was named none."""
        if self.fresh:
            return self._rank_of(job)
        if job.id not in self._named:
            self._named[job.id] = self._rank_of(job)  # submitted since the last cycle
        return self._named[job.id]

    def _rank_of(self, job: Job) -> np.ndarray | None:
        if self._state is None or self._sim is None or job.gpus <= 0:
            return None  # no frame yet, or a pod that asks for no GPU: admitted unchanged
        key = (job.cpus, job.gpus, job.share, job.models)
        rank = self._by_shape.get(key)
        if rank is None:
            if self._view is None:
                self._view = node_view(self._state, self._sim.workload)
            args = (self._state, self._sim.workload, job.cpus, job.gpus, job.share, job.models,
                    self.limit, self._view)
            if self.flat:
                nodes = preferred_order(*args)
                levels = np.zeros(len(nodes), dtype=np.int8)
            else:
                nodes = fgd_order(*args)
                levels = np.ones(len(nodes), dtype=np.int8)
                levels[:1] = 0
            rank = np.full(len(self._state), 2, dtype=np.int8)
            rank[nodes] = levels
            self._by_shape[key] = rank = rank if len(nodes) else rank[:0]
            self.computed += 1
        if len(rank) == 0:
            return None  # it fits nowhere now: no patch
        self.named += 1
        return rank


def pod_strategy(name: str, advisor: AdvisorStrategy | None) -> SteerPod:
    """The strategy ``name`` of :data:`POD_STRATEGIES`, with ``advisor`` for steer-pod+advisor."""
    return SteerPod(name=name, advisor=advisor, flat=name == "steer-pod-flat",
                    fresh=name == "steer-pod-fresh")


__all__ = ["CYCLE", "POD_STRATEGIES", "STEER_STRATEGIES", "Steer", "SteerPod", "pod_strategy"]
