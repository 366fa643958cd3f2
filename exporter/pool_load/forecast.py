"""The predictive policy's forecast: the daily profile plus the recent trend, from the past only.

At the end of hour t the forecast for hour t + h (h >= 1) is

    f(t + h) = d[t] + mean_j (d[t + h - 24 j] - d[t - 24 j]) + trend * h,    j = 1 .. days

the demand now, moved by how much the same hours moved on each of the last
``days`` days (the daily profile, relative, so a pool whose level changed keeps
its new level), plus the trend: the change of the trailing 24-hour mean over the
last day, per hour, damped by ``trend_weight``. Every term reads hours <= t, so
nothing is known that a forecast made at t could not know (for h <= 24, t + h -
24 j <= t). Until a full day of history exists the profile term is 0.
"""

from __future__ import annotations

from collections import deque

import numpy as np

DAY = 24


def forecast_matrix(demand: np.ndarray, horizon: int, days: int = 7,
                    trend_weight: float = 0.5) -> np.ndarray:
    """``out[t, h - 1]`` is the forecast made at the end of hour t for hour t + h, h = 1..horizon."""
    d = np.asarray(demand, dtype=float)
    n = len(d)
    if not 1 <= horizon <= DAY:
        raise ValueError(f"horizon must be 1 to {DAY} hours, got {horizon}")
    out = np.repeat(d[:, None], horizon, axis=1)
    # the profile: mean over past days of (d[t + h - 24 j] - d[t - 24 j])
    for h in range(1, horizon + 1):
        total = np.zeros(n)
        count = np.zeros(n)
        for j in range(1, days + 1):
            lag = DAY * j
            if lag >= n:
                break
            # rows t >= lag have both d[t - lag] and d[t + h - lag] (h <= 24 <= lag keeps it in the past)
            total[lag:] += d[h: n - lag + h] - d[: n - lag]
            count[lag:] += 1
        out[:, h - 1] += np.divide(total, count, out=np.zeros(n), where=count > 0)
    if trend_weight:
        # trailing 24 h means; the trend is their change over the last day, per hour
        csum = np.concatenate(([0.0], np.cumsum(d)))
        mean24 = np.full(n, np.nan)
        mean24[DAY - 1:] = (csum[DAY:] - csum[:-DAY]) / DAY
        trend = np.zeros(n)
        trend[2 * DAY - 1:] = (mean24[2 * DAY - 1:] - mean24[DAY - 1: n - DAY]) / DAY
        out += trend_weight * trend[:, None] * np.arange(1, horizon + 1)[None, :]
    return np.maximum(out, 0.0)


class HourlyHistory:
    """Hourly means of a live series, the last ``days`` days of them, for the live forecast.

    Samples arrive every snapshot; each clock hour's mean is kept when the next hour's
    first sample comes. Hours with no sample (the exporter was down) repeat the last
    mean, so that index i stays "i hours ago" and the daily profile stays aligned; a gap
    longer than the history forgets it. Memory: ``days`` x 24 + 1 floats per pool.
    """

    def __init__(self, days: int = 14):
        self.days = days
        # one more than the days: the profile's oldest term reads d[t - 24 * days]
        self.hours: deque[float] = deque(maxlen=days * DAY + 1)
        self._hour: int | None = None
        self._sum = 0.0
        self._count = 0

    def add(self, now: float, value: float) -> None:
        hour = int(now // 3600)
        if self._hour is not None and hour != self._hour:
            if hour < self._hour:  # the clock went back: start again rather than misalign
                self.hours.clear()
            else:
                mean = self._sum / self._count
                gap = hour - self._hour - 1
                if gap >= self.days * DAY:
                    self.hours.clear()
                self.hours.append(mean)
                self.hours.extend([mean] * min(gap, self.days * DAY))
            self._sum, self._count = 0.0, 0
        self._hour = hour
        self._sum += value
        self._count += 1

    def rise(self, horizon: int, trend_weight: float = 0.5) -> float | None:
        """How far above the last complete hour the forecast peak of the next ``horizon``
        hours is (GPUs, may be negative); None before 25 complete hours (a day and the hour
        before it: the profile's first term)."""
        if len(self.hours) <= DAY:
            return None
        history = np.fromiter(self.hours, float, len(self.hours))
        last = forecast_matrix(history, horizon, self.days, trend_weight)[-1]
        return float(last.max() - history[-1])
