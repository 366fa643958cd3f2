"""The small jobs' daily surge: room a plan must not take from them just before it comes.

A plan that starts a whole-node job holds that room for the job's run, hours. When the fleet's
free GPUs after the plan are fewer than the rise the small jobs' daily profile forecasts over
that run, the surge that comes queues behind jobs the plan started: the small jobs that
arrive then wait for capacity, however little room each asks. Seed 109 at load 1.0 (the
default fleet, docs/simulate.md) went that way: at the daily trough, the queue empty, plans
started whole-node jobs into the last free GPUs 1-3 h before the morning's small jobs came, and
the backlog they left was still there at the window's close.

The small jobs' demand is the GPUs they hold plus those their queued jobs ask, observed at
every evaluation and kept as hourly means (:class:`~exporter.pool_load.forecast.HourlyHistory`,
the load module's forecast: the daily profile and the damped trend). A plan's *shortfall* is
how far that forecast rise over its head's horizon exceeds the free GPUs the plan leaves:

    shortfall = max(0, rise - (free GPUs now - GPUs the plan takes))

and a plan that starts a whole-node job with a shortfall is refused (``engine.surge_gate``):
the head waits for the next evaluation, when the surge has come and gone or the room is
there. Plans that start only small jobs are never refused here: they are what the room is for.

``horizon-lull`` counts the shortfall only while no small job is queued. Once small jobs queue,
a blocked whole-node head's reservation keeps them off its nodes whether or not a plan starts
it (the ``horizon-room`` account), and refusing the plan only keeps the head, and its
reservation, in front of them: on seed 103 at load 1.0, whose last day asks more than the
fleet holds, ``horizon-surge`` refused plans there and started fewer jobs than ``horizon-room``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from exporter.pool_load.forecast import HourlyHistory
from exporter.snapshot import FleetSnapshot

SMALL_GPUS = 8  # a single-node job asking fewer GPUs than this is a small one (backfills fragments)
SURGE_DAYS = 7  # days of hourly means the daily profile is read from
TREND_WEIGHT = 0.5


def small(gpus: float, nodes: int) -> bool:
    """Whether a job of ``gpus`` GPU shares over ``nodes`` nodes is a small one."""
    return nodes <= 1 and 0 < gpus < SMALL_GPUS


def small_demand(snapshot: FleetSnapshot) -> float:
    """GPUs the small jobs (one node, under :data:`SMALL_GPUS`) hold plus those the queued
    small jobs ask, as GPU shares."""
    held = 0.0
    for alloc in snapshot.allocations:
        share = min((p.gpu_share for p in alloc.placements), default=1.0)
        size = alloc.gpu_count * share
        if small(size, len(alloc.placements)):
            held += size
    queued = 0.0
    for job in snapshot.pending:
        size = job.gpu_count * job.gpu_share
        if small(size, max(1, job.node_count)):
            queued += size
    return held + queued


@dataclass
class SmallDemand:
    """The small jobs' demand over the last :data:`SURGE_DAYS` days, hourly, observed at each
    evaluation (:meth:`observe`); what :func:`shortfall` forecasts from."""

    days: int = SURGE_DAYS
    history: HourlyHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = HourlyHistory(self.days)

    def observe(self, snapshot: FleetSnapshot, now: float) -> None:
        self.history.add(now, small_demand(snapshot))

    def rise(self, horizon_seconds: float) -> float | None:
        """How far above the last complete hour the forecast peak over the next
        ``horizon_seconds`` (whole hours, 1 to 24) lies; None before a day and an hour are known."""
        hours = min(24, max(1, math.ceil(horizon_seconds / 3600 - 1e-9)))
        return self.history.rise(hours, TREND_WEIGHT)


def shortfall(rise: float | None, free_gpus: float, taken_gpus: float) -> float | None:
    """GPUs of the small jobs' forecast rise (``rise``) that the free GPUs left once a plan
    takes ``taken_gpus`` of ``free_gpus`` cannot hold; None when no forecast is known."""
    if rise is None:
        return None
    return round(max(0.0, rise - max(0.0, free_gpus - taken_gpus)), 3)


def free_gpus(gpu_free: np.ndarray) -> float:
    """The fleet's free GPU shares (a whole free GPU counts 1)."""
    return float(np.clip(gpu_free, 0.0, 1.0).sum())


__all__ = ["SMALL_GPUS", "SURGE_DAYS", "SmallDemand", "free_gpus", "shortfall", "small",
           "small_demand"]
