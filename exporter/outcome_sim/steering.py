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

- ``steer-pod``: each job, as it is submitted, gets the preferred nodes the webhook
  would name for its ask (:func:`exporter.advisor.steer.preferred_order`: the
  :data:`~exporter.advisor.steer.PREFERRED_NODES` nodes where *its* shape grows F
  least, on its models), computed from the fleet as serve's last cycle saw it: the
  placement state at the last cycle, every ``cycle`` seconds (the advisor's interval,
  60 s, the simulated advisor's cadence; serve reads its sources every 5 s, so this
  is the staler case). A pod's affinity is fixed at its creation, so a job that waits
  keeps the nodes named at its submission; a job started and later put back in the
  queue (an eviction, a preemption: a new pod in Kubernetes) is named nodes again.
  Jobs submitted before the first cycle get none (the webhook admits a pod unchanged
  while serve has no frame). The scheduler then places as kube-scheduler with that
  one preferred term: among the nodes where the job fits, the named ones first (the
  term's NodeAffinity score, 2 x 100 with the default plugin weights, outweighs the
  resource-fit score's 100), and among them, or where it fits none of them, its own
  policy (``bestfit`` by default), all named nodes alike, as one term scores them.
- ``steer-pod+advisor``: the same, and the advisor's compaction at its cadence.
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
POD_STRATEGIES = ("steer-pod", "steer-pod+advisor", "steer-pod-fresh")
CYCLE = 60.0  # seconds between two of serve's cycles, as the simulated advisor sees them


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
    # named again at each scheduling attempt, from the last cycle's state (as a scheduler
    # extender's prioritize call would be asked), not once at submission (the webhook's)
    fresh: bool = False
    cycles: int = 0
    named: int = 0  # jobs given preferred nodes
    computed: int = 0  # (state, shape) pairs scored
    interval: float = field(init=False)
    _next: float = 0.0
    _state: FleetState | None = None  # the fleet at the last cycle: what the webhook answers from
    _view: policies.NodeView | None = None
    _sim: Sim | None = None
    _by_shape: dict[tuple, np.ndarray] = field(default_factory=dict)  # this cycle's answers
    _named: dict[int, np.ndarray | None] = field(default_factory=dict)  # job id -> its nodes

    def __post_init__(self) -> None:
        self.interval = self.cycle if self.advisor is None else min(self.cycle, self.advisor.interval)

    def tick(self, sim: Sim, now: float) -> None:
        if now >= self._next:
            self._next = now + self.cycle
            self.cycles += 1
            if self._sim is None:
                self._sim = sim
                sim.scheduler.steer = self.rank
            # a pod keeps what it was named at its creation: the jobs queued since the last
            # cycle that no pass tried yet are named from the state they were submitted under;
            # a job that started is forgotten (put back in the queue, it is a new pod)
            queued = [] if self.fresh else sim.scheduler.queue.jobs()
            for job in queued:
                if job.id not in self._named:
                    self._named[job.id] = self._nodes_for(job)
            waiting = {job.id for job in queued}
            self._named = {k: v for k, v in self._named.items() if k in waiting}
            self._state = sim.cluster.placer.state
            self._view = None
            self._by_shape.clear()
        if self.advisor is not None:
            self.advisor.tick(sim, now)

    def rank(self, job: Job) -> np.ndarray | None:
        """The scheduler's per-node rank for ``job``: 0 on its preferred nodes, 1 elsewhere;
        None (its policy alone) when it was named none."""
        if self.fresh:
            nodes = self._nodes_for(job)
        elif job.id in self._named:
            nodes = self._named[job.id]
        else:
            nodes = self._named[job.id] = self._nodes_for(job)  # submitted since the last cycle
        if nodes is None or self._sim is None:
            return None
        rank = np.ones(len(self._sim.cluster.placer.names), dtype=np.int8)
        rank[nodes] = 0
        return rank

    def _nodes_for(self, job: Job) -> np.ndarray | None:
        if self._state is None or self._sim is None or job.gpus <= 0:
            return None  # no frame yet, or a pod that asks for no GPU: admitted unchanged
        key = (job.cpus, job.gpus, job.share, job.models)
        nodes = self._by_shape.get(key)
        if nodes is None:
            if self._view is None:
                self._view = node_view(self._state, self._sim.workload)
            nodes = self._by_shape[key] = preferred_order(
                self._state, self._sim.workload, job.cpus, job.gpus, job.share, job.models, self.limit,
                self._view)
            self.computed += 1
        if len(nodes) == 0:
            return None  # it fits nowhere now: no patch
        self.named += 1
        return nodes


__all__ = ["CYCLE", "POD_STRATEGIES", "STEER_STRATEGIES", "Steer", "SteerPod"]
