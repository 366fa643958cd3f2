"""Window statistics of a load series, as Prometheus computes them over a range.

The recording rules (``load_statistics:`` in rules/thresholds.yaml) compute
``avg_over_time``, ``stddev_over_time`` and ``quantile_over_time(0.95, ...)``;
the analyzer computes the same three numbers in-process over its own window,
and the agreement test runs both on one series. So the definitions here are
Prometheus', not numpy's defaults: the standard deviation is the population
one (divided by n, not n - 1) and the quantile interpolates linearly between
the sorted samples at rank ``phi * (n - 1)`` (promql/quantile.go ``quantile``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

P95 = 0.95


@dataclass(frozen=True, slots=True)
class WindowStats:
    mean: float
    stddev: float  # population standard deviation, as stddev_over_time
    p95: float  # quantile_over_time(0.95, ...)


def quantile(phi: float, values: Sequence[float] | np.ndarray) -> float:
    """Prometheus' ``quantile_over_time``: linear interpolation at rank ``phi * (n - 1)``.

    phi below 0 is -Inf and above 1 is +Inf, as in PromQL; no samples is NaN.
    """
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    if n == 0:
        return math.nan
    if phi < 0:
        return -math.inf
    if phi > 1:
        return math.inf
    rank = phi * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return float(ordered[lower] * (1 - weight) + ordered[upper] * weight)


def window_stats(values: Sequence[float] | np.ndarray) -> WindowStats:
    """Mean, standard deviation and p95 of one window, exactly as PromQL's ``*_over_time``.

    - mean: ``avg_over_time``;
    - stddev: ``stddev_over_time``, the population standard deviation (divided by n);
    - p95: ``quantile_over_time(0.95, ...)``, linear interpolation over the sorted
      samples at rank 0.95 * (n - 1).

    Raises ValueError on an empty window (PromQL returns no sample there).
    """
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("window_stats of no samples")
    mean = float(array.mean())
    # two-pass, as numpy: the mean first, then the squared deviations (no cancellation)
    stddev = float(np.sqrt(np.mean((array - mean) ** 2)))
    return WindowStats(mean, stddev, quantile(P95, array))


def rolling_stats(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, stddev and p95 of the trailing ``window`` samples at every index.

    Index i covers ``values[max(0, i - window + 1) : i + 1]``: a range query at
    hour i sees only the past, so the first ``window - 1`` rows use the shorter
    windows Prometheus would have then.
    """
    values = np.asarray(values, dtype=float)
    n = len(values)
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    mean = np.empty(n)
    std = np.empty(n)
    p95 = np.empty(n)
    head = min(window - 1, n)
    for i in range(head):  # the short windows at the start
        s = window_stats(values[: i + 1])
        mean[i], std[i], p95[i] = s.mean, s.stddev, s.p95
    if n >= window:
        view = np.lib.stride_tricks.sliding_window_view(values, window)
        m = view.mean(axis=1)
        mean[head:] = m
        std[head:] = np.sqrt(np.mean((view - m[:, None]) ** 2, axis=1))
        ordered = np.sort(view, axis=1)
        rank = P95 * (window - 1)
        lower = math.floor(rank)
        upper = min(window - 1, lower + 1)
        weight = rank - lower
        p95[head:] = ordered[:, lower] * (1 - weight) + ordered[:, upper] * weight
    return mean, std, p95
