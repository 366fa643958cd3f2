"""Look ahead: before a forecast rise in a pool's whole-node demand, keep whole nodes free.

A pool's whole-node demand is the GPUs its whole-node jobs (8 GPUs or more) hold plus
what the queued ones ask, as hourly means. The load module's forecast
(:func:`exporter.pool_load.forecast.forecast_matrix`: the demand now, the daily profile,
the damped trend) gives the peak expected over the next ``horizon_hours``; its rise
above the last complete hour, in whole nodes of the pool, rounded up, is how many nodes
to keep free:

    keep = ceil(max(0, forecast peak - demand now) / GPUs per node)

The reserved nodes are that many of the pool's whole-size nodes, the emptiest first
(free ones, then those holding the fewest GPUs), among those at most ``nearly_empty``
held: a node mostly full would take longer to drain than a burst gives. Small jobs
are steered away from reserved nodes (they go there only where nothing else fits,
so no job waits for a reservation); the reserved ones that hold small jobs drain as
those end.

The forecast misses, and the miss is measured as the spot quota measures it
(:mod:`exporter.preemption.quota`): each past forecast whose hours are all known is
checked against the peak that came; the mean absolute error, the mean miss (above 0,
the forecast ran low) and the breach share (the peak came more than a node above the
forecast: the reservation fell short by a node or more) are shown beside the nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.pool_load.forecast import DAY
from exporter.preemption.quota import QuotaSettings, peak_forecasts, peaks_ahead

HORIZON_HOURS = 6  # how far ahead: a small job placed now runs into those hours
NEARLY_EMPTY = 0.5  # the most of its GPUs a node may hold and still be reserved
PROFILE_DAYS = 7
TREND_WEIGHT = 0.5
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class LookaheadSettings:
    horizon_hours: int = HORIZON_HOURS
    nearly_empty: float = NEARLY_EMPTY
    days: int = PROFILE_DAYS
    trend_weight: float = TREND_WEIGHT

    def __post_init__(self) -> None:
        if not 1 <= self.horizon_hours <= DAY:
            raise ValueError(f"horizon_hours must be 1 to {DAY}, got {self.horizon_hours}")
        if not 0.0 <= self.nearly_empty <= 1.0:
            raise ValueError(f"nearly_empty must be in [0, 1], got {self.nearly_empty}")
        if not 1 <= self.days <= 28:
            raise ValueError(f"days must be 1 to 28, got {self.days}")

    @property
    def forecast(self) -> QuotaSettings:
        """The same forecast the spot quota reads (its quantile unused here)."""
        return QuotaSettings(self.horizon_hours, days=self.days, trend_weight=self.trend_weight)


@dataclass(frozen=True, slots=True)
class ForecastError:
    """How far the past forecasts of a series' peak missed the peak that came."""

    checked: int  # past forecasts whose hours were all known
    mae_gpus: float | None  # mean |peak - forecast peak|
    bias_gpus: float | None  # mean (peak - forecast peak): above 0, the forecast ran low
    breach_share: float | None  # share whose peak came more than ``tolerance`` above the forecast


@dataclass(frozen=True, slots=True)
class PoolReserve:
    """One pool's look-ahead: the forecast, the nodes to keep free, and the forecast's error."""

    pool: str
    node_gpus: int  # GPUs of the pool's whole-size node
    whole_now_gpus: float  # whole-node demand in the last complete hour
    whole_forecast_gpus: float  # the forecast peak over the next horizon_hours
    keep_free: int  # whole nodes to keep free
    free_now: int  # whole-size nodes of the pool holding nothing now
    reserved: tuple[int, ...]  # the nodes small jobs are steered away from, emptiest first
    horizon_hours: int
    error: ForecastError

    @property
    def rise_gpus(self) -> float:
        return max(0.0, self.whole_forecast_gpus - self.whole_now_gpus)


def forecast_error(hourly: np.ndarray, settings: LookaheadSettings, tolerance: float = 0.0) -> ForecastError:
    """The error of the forecasts of ``hourly``'s peak over the next ``horizon_hours`` that
    the series can check: the quota's measure, with a breach share above ``tolerance``."""
    h = settings.horizon_hours
    if len(hourly) == 0:
        return ForecastError(0, None, None, None)
    came = peaks_ahead(hourly, h)
    if not len(came):
        return ForecastError(0, None, None, None)
    misses = came - peak_forecasts(hourly, settings.forecast)[: len(came)]
    return ForecastError(len(misses), float(np.abs(misses).mean()), float(misses.mean()),
                         float(np.mean(misses > tolerance + EPS)))


def nodes_to_keep(now_gpus: float, forecast_gpus: float, node_gpus: int) -> int:
    """Whole nodes the rise from ``now_gpus`` to ``forecast_gpus`` needs, rounded up."""
    if node_gpus <= 0:
        return 0
    return math.ceil(max(0.0, forecast_gpus - now_gpus) / node_gpus - EPS)


def reserve(gpu_count: np.ndarray, gpu_held: np.ndarray, keep: int, nearly_empty: float = NEARLY_EMPTY,
            node_gpus: int | None = None) -> tuple[int, ...]:
    """Up to ``keep`` of the nodes (indices into the arrays) with ``node_gpus`` GPUs (the
    largest, by default) and at most ``nearly_empty`` of them held: the emptiest first, then
    the lowest index."""
    count = np.asarray(gpu_count, dtype=float)
    held = np.asarray(gpu_held, dtype=float)
    if keep <= 0 or not len(count):
        return ()
    size = float(count.max()) if node_gpus is None else float(node_gpus)
    candidates = np.flatnonzero((count == size) & (held <= nearly_empty * size + EPS))
    order = candidates[np.lexsort((candidates, held[candidates]))]
    return tuple(int(i) for i in order[:keep])


def look_ahead(pool: str, hourly_whole: Sequence[float] | np.ndarray, gpu_count: np.ndarray,
               gpu_held: np.ndarray, settings: LookaheadSettings | None = None) -> PoolReserve:
    """The look-ahead of ``pool`` from its hourly whole-node demand (GPUs, oldest first,
    complete hours) and its nodes' GPUs (``gpu_count``) and GPUs held now (``gpu_held``).
    ``reserved`` indexes those arrays."""
    settings = settings or LookaheadSettings()
    d = np.asarray(hourly_whole, dtype=float)
    count = np.asarray(gpu_count, dtype=float)
    held = np.asarray(gpu_held, dtype=float)
    if d.ndim != 1 or not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("hourly whole-node demand must be finite numbers >= 0")
    if count.shape != held.shape or count.ndim != 1:
        raise ValueError("gpu_count and gpu_held must be one number per node")
    if not (np.isfinite(held).all() and (held >= -EPS).all() and (held <= count + EPS).all()):
        raise ValueError("gpu_held must be between 0 and each node's GPUs")
    node_gpus = int(count.max()) if len(count) else 0
    free_now = int(np.count_nonzero((count == node_gpus) & (held <= EPS))) if node_gpus else 0
    h = settings.horizon_hours
    if len(d) == 0:
        return PoolReserve(pool, node_gpus, 0.0, 0.0, 0, free_now, (), h, ForecastError(0, None, None, None))
    ahead = float(peak_forecasts(d, settings.forecast)[-1])
    keep = min(nodes_to_keep(float(d[-1]), ahead, node_gpus), int(np.count_nonzero(count == node_gpus)))
    reserved = reserve(count, held, keep, settings.nearly_empty, node_gpus)
    return PoolReserve(pool, node_gpus, float(d[-1]), ahead, keep, free_now, reserved, h,
                       forecast_error(d, settings, tolerance=float(node_gpus)))


def away_from(rank: np.ndarray | None, reserved: Sequence[int], size: int) -> np.ndarray | None:
    """A per-node rank (lowest first, as the placer reads it) that puts ``reserved`` after
    every other node and keeps ``rank``'s order within each: a small job's. None where
    nothing is reserved and no rank was given."""
    if not len(reserved):
        return rank
    base = np.zeros(size, dtype=np.int16) if rank is None or not len(rank) else rank.astype(np.int16)
    out = base.copy()
    out[list(reserved)] += int(base.max()) + 1
    return out


__all__ = ["HORIZON_HOURS", "NEARLY_EMPTY", "ForecastError", "LookaheadSettings", "PoolReserve", "away_from",
           "forecast_error", "look_ahead", "nodes_to_keep", "reserve"]
