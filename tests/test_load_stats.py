"""exporter/pool_load/stats.py: PromQL's avg/stddev/quantile_over_time, exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.pool_load.stats import WindowStats, quantile, rolling_stats, window_stats


def test_window_stats_are_promqls():
    # population stddev of 1, 2, 3, 4 is sqrt(1.25); p95 rank 0.95 * 3 = 2.85 -> 3 + 0.85 * (4 - 3)
    s = window_stats([4.0, 1.0, 3.0, 2.0])
    assert s.mean == 2.5
    assert s.stddev == math.sqrt(1.25)
    assert s.p95 == pytest.approx(3.85, abs=1e-15)


def test_one_sample():
    assert window_stats([7.0]) == WindowStats(7.0, 0.0, 7.0)


def test_quantile_edges_follow_promql():
    assert quantile(0.0, [3.0, 1.0, 2.0]) == 1.0
    assert quantile(1.0, [3.0, 1.0, 2.0]) == 3.0
    assert quantile(0.5, [3.0, 1.0, 2.0, 10.0]) == 2.5
    assert quantile(-0.1, [1.0]) == -math.inf
    assert quantile(1.1, [1.0]) == math.inf
    assert math.isnan(quantile(0.5, []))


def test_empty_window_is_refused():
    with pytest.raises(ValueError, match="no samples"):
        window_stats([])


def test_rolling_stats_equal_window_stats_at_every_index():
    values = np.array([0.0, 10.0, 0.0, 5.0, 5.0, 100.0, 1.0])
    mean, std, p95 = rolling_stats(values, 3)
    for i in range(len(values)):
        s = window_stats(values[max(0, i - 2): i + 1])
        assert (mean[i], std[i], p95[i]) == pytest.approx((s.mean, s.stddev, s.p95), abs=1e-12)
    assert mean[5] == 110 / 3
    assert p95[5] == pytest.approx(5 + 0.9 * 95)
