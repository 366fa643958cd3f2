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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.advisor.advise import STEER_EVERY
from exporter.advisor.steer import WEIGHT_BEST, expected_growth, weights
from exporter.outcome_sim.advisor_loop import AdvisorStrategy

if TYPE_CHECKING:
    from exporter.outcome_sim.sim import Sim

STEER_STRATEGIES = ("steer", "steer+advisor")


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


__all__ = ["STEER_STRATEGIES", "Steer"]
