"""The spot quota: how many GPUs of a pool spot jobs may hold over the next hours, so that
high-priority jobs rarely need to preempt them.

From the pool's hourly high-priority demand (GPUs held plus GPUs asked by the queued
high-priority jobs), the load module's forecast (:func:`exporter.pool_load.forecast.forecast_matrix`:
the demand now, the daily profile, the damped trend) gives the peak expected over the next
``horizon`` hours. The forecast misses; how much it missed is measured on the same history:
each past forecast whose hours are all known is checked against the peak that came, and
the ``quantile`` of those misses (the peak above the forecast) is kept as a margin. The quota
is what the pool has left:

    quota = max(0, capacity - forecast peak - margin)

so that the high-priority demand stays under ``capacity - quota`` in about ``quantile`` of the
hours as the history went.

The demand is capped at the pool's capacity before it is forecast: what the quota protects is
the high-priority work the pool can run. A queue beyond the pool's GPUs cannot be served by
withholding spot GPUs, and counted whole it made the forecast of a pool whose queue grows run
low every hour, with a margin (the past misses) as large as the queue's growth, which kept
the pool's quota at 0 for hours after its queue drained.

GFS (Duan et al., ASPLOS 2026) sizes its spot quota the same way, from a forecast of
high-priority demand with its error; this one uses the load module's forecast, not GFS's own
model.

Before any forecast can be checked (fewer than ``horizon + 1`` hours of history) the margin
is 0 and the forecast is the demand of the last hour (the profile needs a day, the trend
two): a young history gives a generous quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.pool_load.forecast import DAY, forecast_matrix

HORIZON_HOURS = 6  # how far ahead the quota holds: a spot job admitted now runs into those hours
ERROR_QUANTILE = 0.9  # the share of past forecasts the margin covers
PROFILE_DAYS = 7  # the forecast's daily profile: the load module's default
TREND_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    horizon_hours: int = HORIZON_HOURS
    quantile: float = ERROR_QUANTILE
    days: int = PROFILE_DAYS
    trend_weight: float = TREND_WEIGHT

    def __post_init__(self) -> None:
        if not 1 <= self.horizon_hours <= DAY:
            raise ValueError(f"horizon_hours must be 1 to {DAY}, got {self.horizon_hours}")
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {self.quantile}")
        if not 1 <= self.days <= 28:
            raise ValueError(f"days must be 1 to 28, got {self.days}")


@dataclass(frozen=True, slots=True)
class SpotQuota:
    """One pool's quota, and the forecast it comes from with the forecast's measured error."""

    pool: str
    capacity_gpus: float
    high_now_gpus: float  # high-priority demand in the last complete hour, capped at capacity
    high_forecast_gpus: float  # the forecast peak over the next horizon_hours
    margin_gpus: float  # the quantile of the past misses (peak above forecast), >= 0
    quota_gpus: float  # GPUs spot jobs may hold
    horizon_hours: int
    forecasts_checked: int  # past forecasts whose hours were all known
    error_mae_gpus: float | None  # their mean absolute error (peak against forecast peak)
    error_bias_gpus: float | None  # their mean miss: above 0, the forecast ran low

    @property
    def error_mae_pct(self) -> float | None:
        """The mean absolute error over the pool's GPUs, in percent."""
        if self.error_mae_gpus is None or self.capacity_gpus <= 0:
            return None
        return 100.0 * self.error_mae_gpus / self.capacity_gpus


def peak_forecasts(hourly: np.ndarray, settings: QuotaSettings) -> np.ndarray:
    """``out[t]``: the forecast made at the end of hour t of the peak over hours t+1 .. t+horizon."""
    return forecast_matrix(hourly, settings.horizon_hours, settings.days, settings.trend_weight).max(axis=1)


def peaks_ahead(hourly: np.ndarray, horizon: int) -> np.ndarray:
    """``out[t]``: the peak that came over hours t+1 .. t+horizon, for each t that has them all."""
    n = len(hourly)
    if n <= horizon:
        return np.empty(0)
    windows = np.lib.stride_tricks.sliding_window_view(hourly[1:], horizon)
    return windows.max(axis=1)[: n - horizon]


def spot_quota(pool: str, capacity_gpus: float, hourly_high: Sequence[float] | np.ndarray,
               settings: QuotaSettings | None = None) -> SpotQuota:
    """The quota of ``pool`` from its hourly high-priority demand (oldest first, complete hours;
    GPUs held plus GPUs asked by the queue, capped here at ``capacity_gpus``)."""
    settings = settings or QuotaSettings()
    d = np.asarray(hourly_high, dtype=float)
    if d.ndim != 1 or not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("hourly high-priority demand must be finite numbers >= 0")
    if not np.isfinite(capacity_gpus) or capacity_gpus < 0:
        raise ValueError(f"capacity must be a finite number >= 0, got {capacity_gpus}")
    h = settings.horizon_hours
    if len(d) == 0:  # nothing known: no forecast, the pool as it is
        return SpotQuota(pool, capacity_gpus, 0.0, 0.0, 0.0, capacity_gpus, h, 0, None, None)
    d = np.minimum(d, capacity_gpus)  # what the pool can run (module docstring)
    forecast = peak_forecasts(d, settings)
    came = peaks_ahead(d, h)
    misses = came - forecast[: len(came)]
    margin = max(0.0, float(np.quantile(misses, settings.quantile))) if len(misses) else 0.0
    ahead = float(forecast[-1])
    quota = max(0.0, capacity_gpus - ahead - margin)
    return SpotQuota(pool, capacity_gpus, float(d[-1]), ahead, margin, quota, h, len(misses),
                     float(np.abs(misses).mean()) if len(misses) else None,
                     float(misses.mean()) if len(misses) else None)


__all__ = ["ERROR_QUANTILE", "HORIZON_HOURS", "QuotaSettings", "SpotQuota", "peak_forecasts", "peaks_ahead",
           "spot_quota"]
