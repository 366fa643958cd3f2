"""Look ahead in the loop: per-pod steering that keeps whole nodes free before a forecast burst.

``steer-pod+lookahead`` is ``steer-pod`` (:class:`~exporter.outcome_sim.steering.SteerPod`,
the admission webhook's preferred nodes, named at a pod's creation) with one more term
for the pods of small jobs (under 8 GPUs): the pools' reserved nodes
(:func:`exporter.advisor.lookahead.look_ahead`) come after every other node, so such a
job goes there only where it fits nowhere else. Whole-node jobs keep ``steer-pod``'s
terms. ``steer-pod+lookahead+advisor`` adds the advisor's compaction at its cadence,
as ``steer-pod+advisor`` does. ``steer-pod+reserve`` is the control: the same steering
with :data:`RESERVE_FIXED` node per pool kept free at every hour, no forecast read, so
what the forecast adds over simply holding a node back is seen apart.

What serve would know is all the strategy reads: every ``SAMPLE_EVERY`` seconds it
samples each pool's (GPU model's) whole-node demand (GPUs the running whole-node jobs
hold there, plus what the queued ones ask, split over the models they may use by
capacity, as the spot quota's gate splits it); on each clock hour it closes the hour's
mean and sets each pool's nodes to keep free from the forecast; the reserved nodes
themselves, the emptiest first, are chosen again at every sample, so a node that
filled is let go and one that drained is taken. A pod keeps what it was named at its
creation, as in ``steer-pod``.

After the run, the forecast's error over the measured window (:func:`fill`): per hour,
the whole-node peak that came over the next hours less the forecast peak, absolute,
summed over pools, over the fleet's GPUs; and the breach share, the pool-hours whose
peak came more than a node above the forecast (the reservation fell a node short or
more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from exporter.advisor.lookahead import LookaheadSettings, away_from, look_ahead, reserve
from exporter.outcome_sim.steering import SteerPod, pod_strategy

if TYPE_CHECKING:
    from exporter.outcome_sim.advisor_loop import AdvisorStrategy
    from exporter.outcome_sim.outcomes import Outcome
    from exporter.outcome_sim.sim import Sim
    from exporter.outcome_sim.timeline import Job

LOOKAHEAD_STRATEGIES = ("steer-pod+lookahead", "steer-pod+lookahead+advisor", "steer-pod+reserve")
RESERVE_FIXED = 1  # steer-pod+reserve's whole nodes kept free per pool, whatever the forecast
SAMPLE_EVERY = 60.0  # seconds between two samples of the whole-node demand (the gate's cadence)
EPS = 1e-9


@dataclass
class Lookahead:
    """``steer-pod`` with small jobs steered away from the pools' reserved nodes (module docstring)."""

    pod: SteerPod
    name: str = "steer-pod+lookahead"
    settings: LookaheadSettings = field(default_factory=LookaheadSettings)
    fixed: int | None = None  # nodes kept free per pool whatever the forecast (the control)
    interval: float = field(init=False)
    hourly: dict[int, list[float]] = field(default_factory=dict)  # pool -> whole-node demand per hour
    keep: dict[int, int] = field(default_factory=dict)  # pool -> whole nodes to keep free this hour
    # (hour the forecast was made at the end of, pool, forecast peak, node GPUs)
    log: list[tuple[int, int, float, int]] = field(default_factory=list)
    reserved: tuple[int, ...] = ()  # the fleet's node indices small jobs are steered away from
    reserved_seconds: float = 0.0  # reserved nodes x seconds, from ``since`` (the mean's numerator)
    _hour: int = 0
    _sums: np.ndarray | None = None
    _samples: int = 0
    _next_sample: float = 0.0
    _last_sample: float = 0.0
    _since: float = 0.0
    _capacity: np.ndarray | None = None  # GPUs per pool
    _size: int = 0  # the fleet's nodes
    _pool_nodes: list[np.ndarray] = field(default_factory=list)  # pool -> its node indices
    _ranks: dict[int, tuple[np.ndarray | None, np.ndarray | None]] = field(default_factory=dict)
    _named: dict[int, np.ndarray | None] = field(default_factory=dict)  # job id -> its rank

    def __post_init__(self) -> None:
        self.interval = self.pod.interval

    def tick(self, sim: Sim, now: float) -> None:
        self.pod.tick(sim, now)
        sim.scheduler.steer = self.rank  # the pod set its own at its first tick: wrap it
        placer = sim.cluster.placer
        if self._capacity is None:
            pools = len(placer.model_names)
            self._size = len(placer.model)
            self._since = sim.settings.timeline.measured_from
            self._capacity = np.bincount(placer.model, weights=placer.gpu_count,
                                         minlength=pools).astype(float)
            self._pool_nodes = [np.flatnonzero(placer.model == m) for m in range(pools)]
        hour = int(now // 3600)
        if hour > self._hour:
            self._close_hours(sim, hour)
        if now >= self._next_sample:
            self._sample(sim, now)
            self._next_sample = now + SAMPLE_EVERY

    def _sample(self, sim: Sim, now: float) -> None:
        """The whole-node demand per pool into the hour's sum; the reserved nodes chosen again."""
        placer = sim.cluster.placer
        assert self._capacity is not None
        span = max(0.0, now - max(self._last_sample, self._since))
        if now > self._since:
            self.reserved_seconds += len(self.reserved) * span
        self._last_sample = now
        demand = np.zeros(len(self._capacity))
        for job in sim.cluster.running.values():
            if job.whole_node:
                for p in job.placements:
                    demand[int(placer.model[p.node])] += job.gpus * job.share
        queued = sim.scheduler.queue.jobs()
        for job in queued:
            if job.whole_node:
                demand += job.demand * self._split(placer, job)
        self._sums = demand if self._sums is None else self._sums + demand
        self._samples += 1
        waiting = {job.id for job in queued}
        self._named = {k: v for k, v in self._named.items() if k in waiting}
        held = placer.gpu_count - placer.gpu_free.sum(axis=1)
        chosen: list[int] = []
        for m, keep in self.keep.items():
            nodes = self._pool_nodes[m]
            picked = reserve(placer.gpu_count[nodes], held[nodes], keep, self.settings.nearly_empty)
            chosen.extend(int(nodes[i]) for i in picked)
        reserved = tuple(sorted(chosen))
        if reserved != self.reserved:
            self.reserved = reserved
            self._ranks.clear()

    def _split(self, placer, job: Job) -> np.ndarray:  # type: ignore[no-untyped-def]
        """The share of ``job``'s demand each pool takes: its allowed models', by capacity."""
        assert self._capacity is not None
        if job.models:
            mask = np.isin(np.array(placer.model_names), job.models)
        else:
            mask = np.ones(len(self._capacity), dtype=bool)
        weights = np.where(mask, self._capacity, 0.0)
        total = float(weights.sum())
        return weights / total if total > 0 else weights

    def _close_hours(self, sim: Sim, hour: int) -> None:
        """The hours before ``hour`` are complete: keep their means (an hour with no sample repeats
        the last), then set each pool's nodes to keep free from its forecast."""
        assert self._capacity is not None
        means = self._sums / self._samples if self._sums is not None and self._samples else None
        for _ in range(self._hour, hour):
            for m in range(len(self._capacity)):
                series = self.hourly.setdefault(m, [])
                series.append(float(means[m]) if means is not None else (series[-1] if series else 0.0))
        self._sums, self._samples, self._hour = None, 0, hour
        placer = sim.cluster.placer
        held = placer.gpu_count - placer.gpu_free.sum(axis=1)
        for m, series in self.hourly.items():
            nodes = self._pool_nodes[m]
            if not len(nodes):
                continue
            # the forecast alone here: the error is measured after the run, on the hours that came
            plan = look_ahead(placer.model_names[m], series[-(self.settings.days + 1) * 24 - 1:],
                              placer.gpu_count[nodes], held[nodes], self.settings)
            self.keep[m] = plan.keep_free if self.fixed is None else self.fixed
            self.log.append((hour - 1, m, plan.whole_forecast_gpus, plan.node_gpus))

    def rank(self, job: Job) -> np.ndarray | None:
        """``steer-pod``'s rank, and for a small job the reserved nodes after every other, as
        named at the pod's creation."""
        base = self.pod.rank(job)
        if job.whole_node or job.gpus <= 0:
            return base
        if job.id in self._named:
            return self._named[job.id]
        if not self.reserved or (base is not None and not len(base)):
            rank = base
        else:
            cached = self._ranks.get(id(base))
            if cached is not None and cached[0] is base:
                rank = cached[1]
            else:
                rank = away_from(base, self.reserved, self._size)
                self._ranks[id(base)] = (base, rank)
        self._named[job.id] = rank
        return rank


@dataclass(frozen=True, slots=True)
class LookaheadFigures:
    reserved_nodes: float | None  # mean nodes reserved over the window
    mae_pct: float | None  # per hour, |peak - forecast peak| summed over pools, over the fleet's GPUs
    breach_pct: float | None  # pool-hours whose peak came more than a node above the forecast


def figures(strategy: Lookahead, since: float, horizon: float) -> LookaheadFigures:
    """The look-ahead's reservation and its forecast's error over [since, horizon): forecasts
    whose hours ended after the run are not checked."""
    window = horizon - since
    reserved = strategy.reserved_seconds / window if window > 0 else None
    if strategy._capacity is None:
        return LookaheadFigures(reserved, None, None)
    capacity = float(strategy._capacity.sum()) or 1.0
    first = math.ceil(since / 3600) - 1
    h = strategy.settings.horizon_hours
    error_by_hour: dict[int, float] = {}
    breaches = checked = 0
    for t, m, forecast, node_gpus in strategy.log:
        series = strategy.hourly.get(m, [])
        if t < first or t + h >= len(series):
            continue
        came = max(series[t + 1: t + h + 1])
        error_by_hour[t] = error_by_hour.get(t, 0.0) + abs(came - forecast)
        breaches += came > forecast + node_gpus + EPS
        checked += 1
    mae = 100.0 * float(np.mean(list(error_by_hour.values()))) / capacity if error_by_hour else None
    return LookaheadFigures(reserved, mae, 100.0 * breaches / checked if checked else None)


def fill(out: Outcome, strategy: object, since: float, horizon: float) -> None:
    """The look-ahead columns of ``out``; left empty for any other strategy."""
    if not isinstance(strategy, Lookahead):
        return
    f = figures(strategy, since, horizon)
    out.lookahead_reserved_nodes = f.reserved_nodes
    out.whole_forecast_mae_pct = f.mae_pct
    out.whole_forecast_breach_pct = f.breach_pct


def lookahead_strategy(name: str, advisor: AdvisorStrategy | None) -> Lookahead:
    """The strategy ``name`` of :data:`LOOKAHEAD_STRATEGIES`, with ``advisor`` for the +advisor form."""
    pod = pod_strategy("steer-pod+advisor" if advisor is not None else "steer-pod", advisor)
    return Lookahead(pod=pod, name=name, fixed=RESERVE_FIXED if name == "steer-pod+reserve" else None)


__all__ = ["LOOKAHEAD_STRATEGIES", "RESERVE_FIXED", "SAMPLE_EVERY", "Lookahead", "LookaheadFigures",
           "figures", "fill", "lookahead_strategy"]
